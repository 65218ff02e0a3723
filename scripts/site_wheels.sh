# Sourced by the GPU scripts: wheels in the repo's .whl/ folder (e.g. invoke, rich, for a host
# without network) are installed into /tmp/site, which goes on PYTHONPATH and PATH. Needs PY.
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
    export PYTHONPATH=$PYTHONPATH:/tmp/site PATH=/tmp/site/bin:$PATH
fi
