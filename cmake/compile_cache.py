"""A compiler launcher that keeps CUDA objects across rebuilds (CMake's CMAKE_CUDA_COMPILER_LAUNCHER).

pip builds each time in a fresh isolated environment, and scikit-build-core then clears the CMake cache and every
object under the build folder's CMakeFiles/, so a second `pip install .` would compile every kernel again. This
launcher stores each object (and its dependency file) under CACHE_DIR, keyed by the compile command without its
output paths, the compiler binary's size and time, and the contents of every source file under SOURCE_ROOTS; a key
it has seen copies the stored files into place instead of compiling.

    python3 compile_cache.py CACHE_DIR SOURCE_ROOTS COMPILER ARGS...     (SOURCE_ROOTS: os.pathsep-separated folders)
"""
import hashlib
import os
import shutil
import subprocess
import sys

_OUTPUT_FLAGS = ("-o", "-MF", "-MT")
_SUFFIXES = (".c", ".h", ".cu", ".cuh")


def _tree_digest(roots):
    """SHA-256 over the paths and contents of the source files under roots."""
    h = hashlib.sha256()
    for root in roots:
        for folder, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(_SUFFIXES):
                    path = os.path.join(folder, name)
                    h.update(path.encode())
                    with open(path, "rb") as f:
                        h.update(f.read())
    return h.hexdigest()


def _outputs(args):
    """The values of -o and -MF (the files a compile writes), and args without the output flags' values."""
    outs, kept, i = {}, [], 0
    while i < len(args):
        if args[i] in _OUTPUT_FLAGS and i + 1 < len(args):
            outs[args[i]] = args[i + 1]
            kept.append(args[i])
            i += 2
        else:
            kept.append(args[i])
            i += 1
    return outs, kept


def main(argv):
    """Run or replay one compile; returns the compiler's exit status."""
    cache_dir, roots, compiler, args = argv[0], [r for r in argv[1].split(os.pathsep) if r], argv[2], argv[3:]
    outs, kept = _outputs(args)
    if "-o" not in outs:
        return subprocess.call([compiler, *args])
    st = os.stat(shutil.which(compiler) or compiler)
    key = hashlib.sha256("\0".join([compiler, str(st.st_size), str(st.st_mtime_ns), *kept, outs.get("-MT", ""),
                                    _tree_digest(roots)]).encode()).hexdigest()
    entry = os.path.join(cache_dir, key[:2], key)
    stored = {flag: os.path.join(entry, flag.strip("-")) for flag in outs if flag != "-MT"}
    if all(os.path.exists(p) for p in stored.values()):
        for flag, path in stored.items():
            shutil.copyfile(path, outs[flag])
        return 0
    status = subprocess.call([compiler, *args])
    if status == 0:
        tmp = entry + f".tmp{os.getpid()}"
        os.makedirs(tmp, exist_ok=True)
        for flag, path in stored.items():
            shutil.copyfile(outs[flag], os.path.join(tmp, flag.strip("-")))
        try:
            os.replace(tmp, entry)
        except OSError:          # another build stored the same key meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
