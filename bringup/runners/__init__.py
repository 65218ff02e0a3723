"""Runners: start a stage's command inside an image, stream its output, enforce its timeout and
stop everything it started (:mod:`.base` holds what they share, :mod:`.local` and :mod:`.docker`
what differs), with the run records that let a sweeper tell live runs from leftovers
(:mod:`.records`) and the environment a stage sees (:mod:`.environment`)."""
