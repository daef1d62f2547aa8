"""Issue #78 item 4: never broken by a missing build, and the kernels' levels on every OS. A host where the
fused kernels cannot be built (Apple clang without libomp, no compiler) still runs the defaults: the
target's GGUF falls back to its conversion and the draft's fast form to its own weights, each saying
why. The CPU's features are read on x86 Linux (`flags`), Arm Linux (`Features`) and macOS (`sysctl`),
so the build key names them and Arm gets its levels (scalar among them, so forcing it works there).
Each case is faked here, with the old behaviour as a control where it had one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from quickdraft import host
from quickdraft.drafters.draft_models import fast_form
from quickdraft.runtime import kernels
from quickdraft.runtime.kernels import levels
from quickdraft.settings import defaults

from conftest import tiny_llama, tiny_text_model


@pytest.fixture
def no_kernels(monkeypatch):
    monkeypatch.setattr(kernels, "fused_ops", lambda level=None: None)


def test_a_gguf_target_falls_back_to_its_conversion_and_says_why(monkeypatch, no_kernels):
    monkeypatch.setattr(defaults, "gguf_types", lambda path, config: {"model.layers.0.mlp.up_proj.weight": "Q4_K"})
    target = dataclasses.replace(tiny_llama(), name="some-model", gguf=Path("/nowhere/m.gguf"))
    choice = defaults.auto_weights(target, "bfloat16", "auto", "cpu")
    assert choice.value == "none" and "no fused CPU kernels" in choice.reason


def test_with_kernels_the_same_target_runs_its_blocks(monkeypatch):  # control: the check is the kernels'
    monkeypatch.setattr(kernels, "fused_ops", lambda level=None: object())
    monkeypatch.setattr(defaults, "gguf_types", lambda path, config: {"model.layers.0.mlp.up_proj.weight": "Q4_K"})
    target = dataclasses.replace(tiny_llama(), name="some-model", gguf=Path("/nowhere/m.gguf"))
    assert defaults.auto_weights(target, "bfloat16", "auto", "cpu").value == "w4a8"


def test_a_drafts_fast_form_keeps_its_own_weights_without_kernels(monkeypatch):
    monkeypatch.setattr(fast_form, "MIN_PARAMS", 0)
    model = tiny_text_model(seed=3).model.to(torch.bfloat16)
    assert fast_form.fast_form(model, 70, "auto").quant is not None  # control: with the kernels, 4-bit blocks
    monkeypatch.setattr(kernels, "fused_ops", lambda level=None: None)
    assert fast_form.fast_form(model, 70, "auto").quant is None


def test_features_are_read_on_every_os():
    x86 = host.features_of({"flags": "fpu avx2 avx_vnni"}, {})
    arm = host.features_of({"Features": "fp asimd asimddp i8mm bf16"}, {})
    mac = host.features_of({}, {"hw.optional.arm.FEAT_DotProd": "1", "hw.optional.arm.FEAT_I8MM": "0"})
    assert {"avx2", "avx_vnni"} <= x86 and {"asimddp", "i8mm"} <= arm and mac == {"asimddp"}
    intel_mac = host.features_of({}, {"machdep.cpu.leaf7_features": "AVX2 AVX512F AVX512VNNI"})
    assert {"avx2", "avx512f", "avx512_vnni"} <= intel_mac
    assert host.features_of({"flags": ""}, {}) == frozenset()  # nothing known: no level beyond scalar


def test_arm_levels_follow_its_features_and_scalar_is_one_of_them():
    assert levels.supported_levels({"asimddp", "i8mm"}, "aarch64") == ["i8mm", "dotprod", "scalar"]
    assert levels.supported_levels({"asimddp"}, "arm64") == ["dotprod", "scalar"]  # macOS names it arm64
    assert levels.supported_levels(frozenset(), "aarch64") == ["scalar"]
    assert levels.supported_levels(frozenset(), "riscv64") == [levels.NATIVE]
    assert "-march=armv8.2-a+dotprod+i8mm" in levels.flags("i8mm", "gcc", "aarch64")
    assert not any("mtune" in f for f in levels.flags("dotprod", "gcc", "aarch64"))


def test_arm_forces_scalar_by_name(monkeypatch):
    monkeypatch.setattr(levels, "cpu_features", lambda: frozenset({"asimddp"}))
    monkeypatch.setattr(levels.platform, "machine", lambda: "aarch64")
    monkeypatch.setenv("QUICKDRAFT_KERNEL_LEVEL", "scalar")
    assert levels.chosen_level() == "scalar"
    monkeypatch.setenv("QUICKDRAFT_KERNEL_LEVEL", "i8mm")
    with pytest.raises(Exception, match="lacks it"):
        levels.chosen_level()
    monkeypatch.delenv("QUICKDRAFT_KERNEL_LEVEL")
    assert levels.chosen_level() == "dotprod"


def test_the_build_key_names_the_cpus_features(monkeypatch):
    monkeypatch.setattr(kernels, "cpu_features", lambda: frozenset({"asimd", "asimddp"}))
    one = kernels.build_dir("scalar")
    monkeypatch.setattr(kernels, "cpu_features", lambda: frozenset({"asimd", "asimddp", "i8mm"}))
    assert kernels.build_dir("scalar") != one  # another CPU's build is never loaded


def test_apple_clang_builds_with_libomp_or_without_openmp(tmp_path):
    assert levels.openmp("gcc (Debian 12.2.0-14) 12.2.0", "Linux") == (["-fopenmp"], ["-fopenmp"])
    assert levels.openmp("Apple clang version 15.0.0", "Darwin", tmp_path) == ([], [])  # no libomp: serial loops
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "omp.h").write_text("")
    compile_flags, link_flags = levels.openmp("Apple clang version 15.0.0", "Darwin", tmp_path)
    assert "-fopenmp" in compile_flags and "-Xpreprocessor" in compile_flags and "-lomp" in link_flags


def test_a_named_targets_own_file_by_path_is_that_target(tmp_path, monkeypatch):
    """Issue #80: `--target FILE.gguf` of the Qwen 1.5B's own file got suffix drafts (the draft and the
    vocabulary ranking were keyed by the display name); its content now names it. A file of the same size
    and other bytes is the control."""
    from quickdraft.weights import default
    from quickdraft.weights.part_packages import PartPackages

    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    mine = tmp_path / "my-copy.gguf"
    mine.write_bytes(b"GGUF" + bytes(range(200)))
    import hashlib

    shipped = PartPackages(module="m", dist="d", version="1", count=1, file_name="x.gguf", size=204,
                           sha256=hashlib.sha256(mine.read_bytes()).hexdigest())  # fmt: skip
    monkeypatch.setattr(default, "NAMED_BY_CONTENT", {"qwen2.5-coder-1.5b": shipped})
    monkeypatch.setattr(default, "ensure_gguf_file", lambda path: tmp_path)
    assert default.converted_target(str(mine))[1] == "Qwen2.5-Coder-1.5B-Instruct"
    assert defaults.KNOWN_DRAFTS.get(default.converted_target(str(mine))[1]) == "qwen2.5-coder-0.5b"
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF" + bytes(range(199, -1, -1)))
    assert default.converted_target(str(other))[1] == "other"
