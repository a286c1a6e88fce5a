"""ggml's device registry read through ctypes (engine/llama/devices.py) checked against the
library itself: the struct ggml_backend_dev_props this ctypes layout describes must be the one
the library fills, or a GPU build reads its memory from the wrong bytes. The CPU device is in
every build, so the check runs here; each field is compared with its own accessor."""
from __future__ import annotations

import ctypes

import pytest

from engine.backend import ModelConfig
from engine.errors import ModelFileError, SettingsError
from engine.llama import backend as llama_backend, devices, resources


def _cpu_device(lib: ctypes.CDLL) -> int:
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        props = devices._Props()
        lib.ggml_backend_dev_get_props(dev, ctypes.byref(props))
        if props.type == devices.DEVICE_TYPES.index("cpu"):
            return dev
    raise AssertionError("llama.cpp's registry has no CPU device")


def test_props_are_exactly_the_size_the_library_fills():
    # ggml_backend_dev_get_props first zeroes sizeof(struct ggml_backend_dev_props) bytes: in a
    # buffer filled with a marker, exactly ctypes' size must be written, the bytes after kept.
    # Three fills with different markers: a written byte (a pointer's, say) may equal one marker
    # by chance, but a byte left alone equals each fill's marker.
    lib = devices._lib()
    size = ctypes.sizeof(devices._Props)
    markers = (0xAB, 0x54, 0xC3)
    filled = []
    for marker in markers:
        buf = (ctypes.c_ubyte * (size + 16))(*([marker] * (size + 16)))
        lib.ggml_backend_dev_get_props(_cpu_device(lib), ctypes.cast(buf, ctypes.POINTER(devices._Props)))
        filled.append(bytes(buf))
    untouched = [all(f[i] == m for f, m in zip(filled, markers)) for i in range(size + 16)]
    assert not any(untouched[:size]) and all(untouched[size:]), untouched


def test_each_field_matches_its_accessor():
    lib = devices._lib()
    dev = _cpu_device(lib)
    sz = ctypes.c_size_t
    lib.ggml_backend_dev_name.argtypes = lib.ggml_backend_dev_description.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_name.restype = lib.ggml_backend_dev_description.restype = ctypes.c_char_p
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(sz), ctypes.POINTER(sz)]
    lib.ggml_backend_dev_memory.restype = None
    props = devices._Props()
    lib.ggml_backend_dev_get_props(dev, ctypes.byref(props))
    free, total = sz(), sz()
    lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    assert props.name == lib.ggml_backend_dev_name(dev) == b"CPU"
    assert props.description == lib.ggml_backend_dev_description(dev)
    assert props.type == lib.ggml_backend_dev_type(dev) == 0
    # Free memory moves between two calls; the total does not.
    assert props.memory_total == total.value > 0 and 0 < props.memory_free <= total.value
    # The CPU backend's capabilities (ggml-cpu.cpp): buffers from host pointers and mmap only.
    caps = props.caps
    assert (caps.async_, caps.host_buffer, caps.buffer_from_host_ptr, caps.events,
            caps.mmap_support) == (False, False, True, False, True)


def test_the_registry_lists_the_cpu_once_and_gpus_only_of_gpu_backends():
    found = devices.devices()
    assert [d.kind for d in found if d.backend == "CPU"] == ["cpu"]
    # A CPU-only build (this venv's) has neither; a GPU build names its GPUs' backends.
    assert {d.backend for d in devices.gpus()} <= set(devices.gpu_backends())
    assert all(d.kind in ("gpu", "igpu") for d in devices.gpus())


def test_metal_and_integrated_gpus_share_the_hosts_memory():
    # Metal's device reports type GPU, not IGPU; its registry is named "MTL".
    metal = devices.Device("MTL0", "Apple M2", "gpu", "MTL", 12 << 30, 12 << 30)
    card = devices.Device("CUDA0", "NVIDIA H200", "gpu", "CUDA", 140 << 30, 141 << 30)
    igpu = devices.Device("Vulkan0", "Intel Arc", "igpu", "Vulkan", 8 << 30, 16 << 30)
    assert metal.unified and igpu.unified and not card.unified


def test_the_gpus_a_load_uses_are_chosen_as_llama_cpp_chooses_them():
    cuda = devices.Device("CUDA0", "RTX 4090", "gpu", "CUDA", 22 << 30, 24 << 30, "0000:01:00.0")
    # The same card through the Vulkan backend of a build with both, and a laptop's iGPU.
    same = devices.Device("Vulkan0", "RTX 4090", "gpu", "Vulkan", 22 << 30, 24 << 30, "0000:01:00.0")
    igpu = devices.Device("Vulkan1", "Radeon 780M", "igpu", "Vulkan", 30 << 30, 60 << 30, "0000:c1:00.0")
    rpc = devices.Device("RPC[10.0.0.2:50052]", "", "gpu", "RPC", 8 << 30, 8 << 30)
    cpu = devices.Device("CPU", "AMD", "cpu", "CPU", 60 << 30, 64 << 30)
    assert devices.offload_targets([cpu, rpc, cuda, same, igpu]) == [cuda]
    # Two cards without ids are both used.
    other = devices.Device("CUDA1", "RTX 4090", "gpu", "CUDA", 22 << 30, 24 << 30)
    assert devices.offload_targets([cuda, other]) == [cuda, other]
    # An iGPU alone is used; one backend's iGPUs only (one chip seen by two backends).
    sycl = devices.Device("SYCL0", "Radeon 780M", "igpu", "SYCL", 30 << 30, 60 << 30)
    assert devices.offload_targets([cpu, igpu, sycl]) == [igpu]
    assert devices.offload_targets([cpu, rpc]) == []


def _params_handed_to_llama(monkeypatch, tmp_path, gpus, **config) -> dict:
    """The parameters LlamaBackend hands llama.cpp for the model and its context, with `gpus` as
    the registry's answer (the load is stopped at the context)."""
    seen: dict = {}
    api = resources.llama_cpp

    def load_model(path, params):
        seen["n_gpu_layers"] = params.n_gpu_layers
        return 1

    def init_context(model, params):
        seen["flash_attn"] = {api.LLAMA_FLASH_ATTN_TYPE_ENABLED: True,
                              api.LLAMA_FLASH_ATTN_TYPE_DISABLED: False,
                              api.LLAMA_FLASH_ATTN_TYPE_AUTO: "auto"}[params.flash_attn_type]
        seen["kv_types"] = (params.type_k, params.type_v)
        seen["offload_kqv"] = params.offload_kqv
        return None

    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    monkeypatch.setattr(api, "llama_model_load_from_file", load_model)
    monkeypatch.setattr(api, "llama_model_get_vocab", lambda model: 1)
    monkeypatch.setattr(api, "llama_vocab_n_tokens", lambda vocab: 32)
    monkeypatch.setattr(api, "llama_model_free", lambda model: None)
    monkeypatch.setattr(api, "llama_init_from_model", init_context)
    monkeypatch.setattr(devices, "gpus", lambda: gpus)
    monkeypatch.setattr(llama_backend, "add_rpc_workers", lambda endpoints: None)
    try:
        llama_backend.LlamaBackend(ModelConfig(str(path), n_ctx=256, **config))
    except ModelFileError:
        pass
    return seen


def test_gpu_layers_and_flash_attention_reach_llama_cpp(monkeypatch, tmp_path):
    card = [devices.Device("CUDA0", "NVIDIA H200", "gpu", "CUDA", 140 << 30, 141 << 30)]
    on_gpu = _params_handed_to_llama(monkeypatch, tmp_path, card, n_gpu_layers=29)
    # Flash attention "auto" (the default) is llama.cpp's own auto with layers on a GPU.
    assert on_gpu["n_gpu_layers"] == 29 and on_gpu["flash_attn"] == "auto"
    assert on_gpu["kv_types"] == (resources.llama_cpp.GGML_TYPE_F16,) * 2
    # llama.cpp's defaults put the KV cache of offloaded layers beside them.
    assert on_gpu["offload_kqv"] is True
    cpu_build = _params_handed_to_llama(monkeypatch, tmp_path, [], n_gpu_layers=29)
    assert cpu_build["n_gpu_layers"] == 29 and cpu_build["flash_attn"] is False
    none = _params_handed_to_llama(monkeypatch, tmp_path, card, n_gpu_layers=0)
    assert none["n_gpu_layers"] == 0 and none["flash_attn"] is False
    # On RPC workers every layer goes there unless told, without flash attention.
    rpc = _params_handed_to_llama(monkeypatch, tmp_path, card, rpc=("10.0.0.2:50052",))
    assert rpc["n_gpu_layers"] == 0x7FFFFFFF and rpc["flash_attn"] is False


class _FakeGgml:
    """The few ggml calls `largest_tensor` makes, on a device that refuses any product whose
    weight is over `limit` bytes (ggml-vulkan's maxStorageBufferRange check)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.shapes, self.asked, self.freed = limit, {}, 0, False

    def ggml_tensor_overhead(self) -> int:
        return 368

    def ggml_init(self, params) -> int:
        assert params.no_alloc  # nothing is ever allocated
        return 1

    def ggml_free(self, ctx) -> None:
        self.freed = True

    def ggml_new_tensor_2d(self, ctx, type_, ne0, ne1) -> int:
        self.shapes[len(self.shapes) + 10] = (ne0, ne1)
        return len(self.shapes) + 9

    def ggml_mul_mat(self, ctx, w, x) -> int:
        return -w

    def ggml_backend_dev_supports_op(self, dev, op) -> bool:
        self.asked += 1
        ne0, ne1 = self.shapes[-op]
        return ne0 * ne1 * 4 <= self.limit


def test_the_largest_tensor_is_found_by_asking_the_device():
    lavapipe = _FakeGgml(128 * 1024 * 1024)
    assert devices.largest_tensor(lavapipe, 7, 2 << 30) == 128 * 1024 * 1024
    assert lavapipe.freed and lavapipe.asked <= 20
    # Rows of the probe's width: a limit between two is rounded down.
    assert devices.largest_tensor(_FakeGgml(100 * 1024 * 1024 + 5), 7, 2 << 30) == (
        100 * 1024 * 1024 // devices.PROBE_ROW_BYTES * devices.PROBE_ROW_BYTES)
    # No limit up to the device's memory, or a device refusing f32 products at any size: 0.
    assert devices.largest_tensor(_FakeGgml(1 << 40), 7, 24 << 30) == 0
    assert devices.largest_tensor(_FakeGgml(0), 7, 24 << 30) == 0


def test_the_cpu_device_takes_any_size():
    lib = devices._lib()
    assert devices.largest_tensor(lib, _cpu_device(lib), 64 << 30) == 0


def test_flash_attention_and_the_kv_cache_type_reach_llama_cpp(monkeypatch, tmp_path):
    card = [devices.Device("CUDA0", "NVIDIA H200", "gpu", "CUDA", 140 << 30, 141 << 30)]
    api = resources.llama_cpp
    off = _params_handed_to_llama(monkeypatch, tmp_path, card, n_gpu_layers=29, flash_attn="off")
    assert off["flash_attn"] is False
    on_cpu = _params_handed_to_llama(monkeypatch, tmp_path, [], flash_attn="on")
    assert on_cpu["flash_attn"] is True
    # A quantized KV cache needs flash attention: auto turns it on, on the CPU too.
    q8 = _params_handed_to_llama(monkeypatch, tmp_path, [], kv_type="q8_0")
    assert q8["flash_attn"] is True and q8["kv_types"] == (api.GGML_TYPE_Q8_0,) * 2
    q4 = _params_handed_to_llama(monkeypatch, tmp_path, card, n_gpu_layers=-1, kv_type="q4_0")
    assert q4["flash_attn"] == "auto" and q4["kv_types"] == (api.GGML_TYPE_Q4_0,) * 2


@pytest.mark.parametrize("flash_attn,kv_type,says", [
    ("off", "q8_0", "needs flash attention"), ("maybe", "f16", "flash attention setting"),
    ("auto", "q5_1", "KV cache type")])
def test_a_bad_attention_setting_is_one_line_before_anything_loads(flash_attn, kv_type, says):
    with pytest.raises(SettingsError, match=says) as err:
        ModelConfig("m.gguf", flash_attn=flash_attn, kv_type=kv_type)
    assert "\n" not in str(err.value)
