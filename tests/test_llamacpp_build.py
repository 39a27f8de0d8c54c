"""The llama.cpp builder's decisions: CMake flags per target, the cache key, the pinned source."""

import io
import tarfile

import pytest
from click.testing import CliRunner

from pi2cli.builds.baselines import llamacpp_build as lb
from pi2cli.cli import cli
from pi2cli.errors import Pi2Error

AMX_CPUINFO = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f amx_bf16 amx_tile amx_int8\n"
PLAIN_CPUINFO = "processor\t: 0\nflags\t\t: fpu sse2 avx2\n"


def test_cpu_has_amx_reads_the_flags_line():
    assert lb.cpu_has_amx(AMX_CPUINFO)
    assert not lb.cpu_has_amx(PLAIN_CPUINFO)
    assert not lb.cpu_has_amx("model name\t: amx_tile lookalike\n")  # only the flags line counts


def test_host_args_turn_amx_off_only_where_advertised():
    with_amx = lb.cmake_args("host", host_machine="x86_64", host_has_amx=True)
    without = lb.cmake_args("host", host_machine="x86_64", host_has_amx=False)
    arm_host = lb.cmake_args("host", host_machine="aarch64", host_has_amx=True)
    assert f"-DCMAKE_C_FLAGS={lb.NO_AMX}" in with_amx and f"-DCMAKE_CXX_FLAGS={lb.NO_AMX}" in with_amx
    assert not any("amx" in a for a in without)
    assert not any("amx" in a for a in arm_host)
    for args in (with_amx, without):
        for flag in ("-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                     "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF"):  # fmt: skip
            assert flag in args


def test_linux_arm64_is_static_cross_build_without_openmp():
    args = lb.cmake_args("linux-arm64")
    assert "-DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc" in args
    assert "-DCMAKE_EXE_LINKER_FLAGS=-static" in args
    assert "-DGGML_OPENMP=OFF" in args and "-DGGML_NATIVE=OFF" in args
    assert not any("amx" in a for a in args)


def test_android_needs_the_ndk(tmp_path):
    with pytest.raises(Pi2Error, match="ANDROID_NDK_HOME"):
        lb.cmake_args("android-arm64", ndk_home="")
    with pytest.raises(Pi2Error, match="android.toolchain.cmake"):
        lb.cmake_args("android-arm64", ndk_home=str(tmp_path))
    toolchain = tmp_path / "build" / "cmake" / "android.toolchain.cmake"
    toolchain.parent.mkdir(parents=True)
    toolchain.write_text("")
    args = lb.cmake_args("android-arm64", ndk_home=str(tmp_path))
    assert f"-DCMAKE_TOOLCHAIN_FILE={toolchain}" in args
    assert "-DANDROID_ABI=arm64-v8a" in args and "-DGGML_OPENMP=OFF" in args


def test_unknown_target_is_an_error():
    with pytest.raises(Pi2Error, match="unknown llama.cpp build target"):
        lb.cmake_args("windows-x86")


def test_cache_key_follows_flags_target_and_source():
    args = lb.cmake_args("host", host_machine="x86_64", host_has_amx=False)
    key = lb.cache_key("host", args)
    assert key == lb.cache_key("host", list(args))  # stable
    assert key != lb.cache_key("host", [*args, "-DGGML_AVX512=OFF"])
    assert key != lb.cache_key("linux-arm64", args)
    assert key != lb.cache_key("host", args, source_sha256="0" * 64)
    assert lb.build_dir_for("host", key).name == f"host-{key}"


def test_parse_progress_understands_ninja_and_make():
    from pi2cli.builds.cmake_run import parse_progress

    assert parse_progress("[12/224] Building CXX object src/llama.cpp.o") == (12, 224)
    assert parse_progress("[ 45%] Building C object ggml.c.o") == (45, 100)
    assert parse_progress("-- Configuring done") is None


def test_sdist_with_wrong_hash_is_refused(tmp_path):
    (tmp_path / lb.SDIST_NAME).write_bytes(b"not the sdist")
    with pytest.raises(Pi2Error, match="sha256"):
        lb.fetch_sdist(tmp_path)


def test_unpack_takes_only_the_vendored_tree(tmp_path):
    sdist = tmp_path / "fake.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        for name, data in [(lb.VENDORED_PREFIX + "CMakeLists.txt", b"project(x)\n"),
                           (lb.VENDORED_PREFIX + "src/a.c", b"int a;\n"),
                           (lb.VENDORED_PREFIX + ".git", b"gitdir: ../../.git/modules/vendor/llama.cpp\n"),
                           (lb.GIT_MODULE_PREFIX + "HEAD", b"0c1e57098bba43ac29e6e3b677cdceebdd22334f\n"),
                           (lb.GIT_MODULE_PREFIX + "config", b"[core]\n\tworktree = ../../../../vendor/llama.cpp\n"),
                           (f"llama_cpp_python-{lb.SDIST_VERSION}/setup.py", b"")]:  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    root = lb.unpack_source(sdist, tmp_path)
    assert (root / "CMakeLists.txt").read_text() == "project(x)\n"
    assert (root / "src" / "a.c").exists()
    assert not (root / "setup.py").exists()
    # the submodule's git dir sits next to the tree, linked by absolute paths both ways
    git_dir = root.parent / (root.name + ".git")
    assert (root / ".git").read_text() == f"gitdir: {git_dir}\n"
    assert f"worktree = {root}" in (git_dir / "config").read_text()
    assert lb.unpack_source(sdist, tmp_path) == root  # second call reuses it


def test_is_complete_needs_marker_and_every_tool(tmp_path):
    (tmp_path / "bin").mkdir()
    for tool in lb.TOOLS:
        (tmp_path / "bin" / tool).write_text("")
    assert not lb.is_complete(tmp_path)
    (tmp_path / lb.COMPLETE_MARKER).write_text("{}")
    assert lb.is_complete(tmp_path)
    (tmp_path / "bin" / "llama-server").unlink()
    assert not lb.is_complete(tmp_path)


def test_build_pi2_engine_prints_the_engine_path_last():
    result = CliRunner().invoke(cli, ["build", "--engine", "pi2"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1].endswith("pi2-engine")


def test_build_rejects_unknown_target():
    result = CliRunner().invoke(cli, ["build", "--engine", "llama.cpp", "--target", "ios"])
    assert result.exit_code == 2
    assert "ios" in result.output


def test_cached_build_has_every_tool(llamacpp_bindir):
    for tool in lb.TOOLS:
        assert (llamacpp_bindir / tool).exists(), tool
