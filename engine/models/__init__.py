"""Model definitions (DeepSeek-V3)."""
