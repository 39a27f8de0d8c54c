"""pi2 build --engine pi2: CMake arguments per target, the NDK fallback, and the content-hashed reuse."""

import json

import pytest

from pi2cli.builds import engine_build as eb
from pi2cli.errors import Pi2Error


def test_android_uses_the_ndk_toolchain_when_given(tmp_path):
    toolchain = tmp_path / "build" / "cmake" / "android.toolchain.cmake"
    toolchain.parent.mkdir(parents=True)
    toolchain.write_text("")
    args = eb.cmake_args("android-arm64", ndk=str(tmp_path), android_api=30)
    assert f"-DCMAKE_TOOLCHAIN_FILE={toolchain}" in args
    assert "-DANDROID_ABI=arm64-v8a" in args and "-DANDROID_PLATFORM=android-30" in args


def test_android_without_ndk_falls_back_to_the_static_cross_build():
    assert eb.cmake_args("android-arm64", ndk="") == eb.cmake_args("linux-arm64")
    assert any("cmake-aarch64-linux-gnu.cmake" in a for a in eb.cmake_args("linux-arm64"))


def test_unknown_target_is_one_clear_error():
    with pytest.raises(Pi2Error, match="unknown build target"):
        eb.cmake_args("mips")


def test_source_hash_follows_sources_and_flags(tmp_path):
    (tmp_path / "a.c").write_text("int a;")
    first = eb.source_hash(["-DX=1"], root=tmp_path)
    assert eb.source_hash(["-DX=1"], root=tmp_path) == first
    assert eb.source_hash(["-DX=2"], root=tmp_path) != first
    (tmp_path / "a.c").write_text("int b;")
    assert eb.source_hash(["-DX=1"], root=tmp_path) != first


def test_a_build_is_reused_only_when_its_record_matches(tmp_path):
    assert not eb._up_to_date(tmp_path, "k1")
    (tmp_path / "pi2-engine").write_text("")
    (tmp_path / eb.RECORD).write_text(json.dumps({"key": "k1"}))
    assert eb._up_to_date(tmp_path, "k1")
    assert not eb._up_to_date(tmp_path, "k2")
    (tmp_path / "pi2-engine").unlink()
    assert not eb._up_to_date(tmp_path, "k1")


def test_a_build_that_makes_no_engine_is_one_error_line_naming_the_log(tmp_path, monkeypatch):
    # CMake succeeded but left no pi2-engine (a target renamed, a broken CMakeLists): the message names the
    # log; it once named an undefined variable and ended in a NameError instead
    monkeypatch.setattr(eb, "cmake_build", lambda *a, **k: None)
    with pytest.raises(Pi2Error, match=r"produced no pi2-engine \(log: .*build\.log\)"):
        eb._build(tmp_path, "host", [], 1, False)
