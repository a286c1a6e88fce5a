"""scripts/lib.sh picks llama.cpp's GPU backend from the tools a machine has: CUDA for the card's
own compute capability where nvcc is, a CPU build and one line where only the card is, Vulkan
where vulkaninfo sees a GPU (not Mesa's lavapipe, a CPU-type device) and glslc and headers from
1.3.261 on are. The machine is made up: fake nvidia-smi, nvcc and glslc on a
PATH that holds nothing else but the shell tools the function uses."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("dirname", "uname", "grep", "cut", "sed", "sort", "tr", "paste", "head", "cat")
CPU = "-DGGML_NATIVE=OFF -DGGML_RPC=ON -DGGML_AVX=ON -DGGML_AVX2=ON"


def with_gpu(flags: str) -> str:
    """The CPU build's flags with the GPU backend's after the RPC flag, where lib.sh puts them."""
    return CPU.replace(" -DGGML_AVX=", f" {flags} -DGGML_AVX=")


def run(tmp_path: Path, fakes: dict[str, str], vulkan_headers: int = 0) -> tuple[str, str]:
    """lib.sh's flags and messages on a made-up machine; `vulkan_headers`: the VK_HEADER_VERSION of
    the SDK's headers (0: none)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        if found is None:
            pytest.skip(f"{tool} is not installed")
        (bin_dir / tool).symlink_to(found)
    for name, body in fakes.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    sdk = tmp_path / "sdk"
    if vulkan_headers:
        (sdk / "include" / "vulkan").mkdir(parents=True)
        (sdk / "include" / "vulkan" / "vulkan_core.h").write_text(
            f"#define VK_HEADER_VERSION {vulkan_headers}\n")
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "TANDEM_LLAMA_FLAGS": "avx avx2",
           "VULKAN_SDK": str(sdk), "CUDA_HOME": str(tmp_path / "no-cuda")}
    bash = shutil.which("bash")
    assert bash is not None
    done = subprocess.run([bash, "-c", f"source {ROOT}/scripts/lib.sh; llama_cmake_args"],
                          env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip(), done.stderr.strip()


@pytest.mark.skipif(os.uname().sysname != "Linux" or os.uname().machine != "x86_64",
                    reason="the x86 Linux branch of lib.sh")
class TestBackend:
    def test_no_gpu_tools_build_for_the_cpu_alone(self, tmp_path):
        assert run(tmp_path, {}) == (CPU, "")

    def test_nvcc_builds_cuda_for_this_cards_capability(self, tmp_path):
        smi = ('case "$1" in -L) echo "GPU 0: NVIDIA H200";; *) echo "9.0"; echo "9.0";; esac')
        out, err = run(tmp_path, {"nvidia-smi": smi, "nvcc": "exit 0"})
        cuda = f"-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER={tmp_path}/bin/nvcc"
        assert out == with_gpu(cuda) and err == ""

    def test_several_cards_build_each_capability_once(self, tmp_path):
        smi = ('case "$1" in -L) echo "GPU 0: A"; echo "GPU 1: B";; '
               '*) echo "9.0"; echo "8.6"; echo "9.0";; esac')
        out, _ = run(tmp_path, {"nvidia-smi": smi, "nvcc": "exit 0"})
        assert "-DCMAKE_CUDA_ARCHITECTURES=86;90 " in out

    def test_a_card_without_nvcc_builds_for_the_cpu_and_says_what_to_install(self, tmp_path):
        smi = 'case "$1" in -L) echo "GPU 0: NVIDIA RTX 4090";; *) echo "8.9";; esac'
        out, err = run(tmp_path, {"nvidia-smi": smi})
        assert out == CPU
        assert len(err.splitlines()) == 1 and "install the CUDA toolkit (nvcc)" in err

    def test_vulkan_needs_a_gpu_glslc_and_new_enough_headers(self, tmp_path):
        gpu = 'echo "        deviceType         = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU"'
        lavapipe = 'echo "        deviceType         = PHYSICAL_DEVICE_TYPE_CPU"'
        cases = {"glslc-only": ({"glslc": "exit 0"}, 309),
                 "lavapipe": ({"glslc": "exit 0", "vulkaninfo": lavapipe}, 309),
                 "old-headers": ({"glslc": "exit 0", "vulkaninfo": gpu}, 239),
                 "gpu": ({"glslc": "exit 0", "vulkaninfo": gpu}, 309)}
        got = {}
        for name, (fakes, version) in cases.items():
            (tmp_path / name).mkdir()
            got[name] = run(tmp_path / name, fakes, vulkan_headers=version)
        assert got["glslc-only"] == (CPU, "") and got["lavapipe"] == (CPU, "")
        out, err = got["old-headers"]
        assert out == CPU and len(err.splitlines()) == 1 and "older than 1.3.261" in err
        include = tmp_path / "gpu" / "sdk" / "include"
        assert got["gpu"] == (with_gpu(f"-DGGML_VULKAN=ON -DVulkan_INCLUDE_DIR={include}"), "")
