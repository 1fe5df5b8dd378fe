#!/bin/sh
# Install a `tritonserver` command (at $1) that runs the binary the nvidia-pytriton wheel ships:
# its shared libraries on the loader path and the Python backend assembled from the wheel's
# files (stack/processes.py does the same for `overspill up`).
set -eu
site=$(python3 -c 'import importlib.util as u; print(u.find_spec("pytriton").submodule_search_locations[0])')
server="$site/tritonserver"
version=$(python3 -c 'import sys; print(f"{sys.version_info.major}.{sys.version_info.minor}")')
backends=/opt/triton/backends
mkdir -p "$backends/python"
ln -sf "$server/backends/python/libtriton_python.so" "$server/backends/python/triton_python_backend_utils.py" \
  "$server/python_backend_stubs/$version/triton_python_backend_stub" "$backends/python/"
cat > "$1" <<SH
#!/bin/sh
# The Python stub imports numpy & co. from the python3 first on PATH (this image's).
export LD_LIBRARY_PATH="$site/../nvidia_pytriton.libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$server/bin/tritonserver" --backend-directory=$backends "\$@"
SH
chmod +x "$1"
