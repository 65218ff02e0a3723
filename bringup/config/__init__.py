"""Configuration: the matrix (images, pins, quirks, stage settings), the recipes, the user's model
inputs and pinned vendor sources, each validated with errors that name the file, the key and
what was expected (exit 2)."""
