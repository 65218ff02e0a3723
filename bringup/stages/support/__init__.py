"""Helpers of the in-image stages (stdlib only): running commands, interruptions, the layer
guard, ABI and ELF checks, env steps and bakes, prerequisites, vendor archives and sources."""
