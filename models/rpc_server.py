"""Where the `rpc-server` built for this llama-cpp-python lives (scripts/lib.sh builds it).

scripts/lib.sh compiles llama.cpp's rpc-server from the sources of the installed wheel against
the wheel's own ggml libraries and caches it, with copies of those libraries, in
$TANDEM_HOME/wheels/llama-cpp-<key>/rpc-server/. The build whose libggml-rpc matches the
installed one byte for byte is the one that speaks this Tandem's protocol version.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path

from engine.errors import TandemError

RPC_LIB = "libggml-rpc.dylib" if sys.platform == "darwin" else "libggml-rpc.so"


class WorkerBuildError(TandemError):
    """No rpc-server built for the installed llama-cpp-python."""


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def installed_lib_dir() -> Path | None:
    """llama_cpp/lib of the installed wheel, found without loading llama.cpp."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "lib"


def find_rpc_server(home: Path | None = None, lib_dir: Path | None = None) -> Path:
    """The rpc-server binary matching the installed wheel ($TANDEM_RPC_SERVER overrides)."""
    override = os.environ.get("TANDEM_RPC_SERVER")
    if override:
        if not Path(override).is_file():
            raise WorkerBuildError(f"TANDEM_RPC_SERVER points at {override}, which does not exist")
        return Path(override)
    home = home or Path(os.environ.get("TANDEM_HOME", Path.home() / ".cache" / "tandem"))
    lib_dir = lib_dir or installed_lib_dir()
    installed = lib_dir / RPC_LIB if lib_dir is not None else None
    if installed is None or not installed.is_file():
        raise WorkerBuildError("the installed llama-cpp-python has no RPC backend; run scripts/run "
                               "to build it with RPC and rpc-server")
    want = _digest(installed)
    for exe in sorted((home / "wheels").glob("llama-cpp-*/rpc-server/rpc-server")):
        lib = exe.parent / RPC_LIB
        if lib.is_file() and _digest(lib) == want:
            return exe
    raise WorkerBuildError(f"no rpc-server built for the installed llama-cpp-python under "
                           f"{home / 'wheels'}; run scripts/run to build it")
