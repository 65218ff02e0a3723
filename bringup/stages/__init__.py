"""The in-image side of each stage (stdlib only, plus the image's torch where a stage needs it).

Each module has ``run(spec, out) -> (status, body, versions)``: ``body`` holds the stage's own
keys, ``versions`` the probe of the image; :mod:`bringup.stages` adds the header and writes the
record. The host never imports these.
"""
