"""The host side: the pipeline that decides, per stage and image, whether to run (inputs hash,
locks), starts the stage through a runner, and the host tools around it (display, clean,
doctor, CI matrix, build report)."""
