"""`pi2 build`: build an engine for a target; prints the directory holding the binaries last."""

import click

from pi2cli.builds.engine_build import DEFAULT_ANDROID_API, TARGETS


@click.command(name="build")
@click.option(
    "--engine",
    type=click.Choice(["pi2", "llama.cpp"]),
    default="pi2",
    show_default=True,
    help="pi2: the native engine in native/. llama.cpp: the baseline, from the pinned source.",
)
@click.option(
    "--target",
    type=click.Choice(TARGETS),
    default="host",
    show_default=True,
    help="host: this machine. linux-arm64: static binaries from the aarch64 cross compiler. "
    "android-arm64: the Android NDK in $ANDROID_NDK_HOME.",
)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(1),
    default=None,
    help="Parallel compile jobs [default: cores, max 8].",
)
@click.option(
    "--android-api",
    type=click.IntRange(21),
    default=DEFAULT_ANDROID_API,
    show_default=True,
    help="Android API level for --engine pi2 --target android-arm64.",
)
def command(engine: str, target: str, jobs: int | None, android_api: int) -> None:
    """Build pi2-engine or llama.cpp for this host, android-arm64 or linux-arm64.

    pi2-engine is built from native/ into build/TARGET (where `pi2 push` looks); a build whose
    sources, flags and compiler are unchanged is reused without running CMake. android-arm64 uses the
    NDK in $ANDROID_NDK_HOME / $ANDROID_NDK_ROOT (arm64-v8a); without an NDK, linux-arm64 makes static
    binaries with Debian's aarch64 cross compiler that also run on Android from /data/local/tmp. One
    binary carries the NEON, dotprod and i8mm kernels and picks at run time.

    llama.cpp is built from the llama-cpp-python 0.3.36 sdist (llama.cpp commit 0c1e570, sha256
    checked) into ~/.cache/pi2/llama.cpp/TARGET-KEY, KEY hashing the source and every CMake flag: an
    unchanged build is reused at once. Only the tools pi2 uses are built (llama-server, llama-bench,
    llama-completion, llama-cli, llama-tokenize, llama-simple). The last line printed is the directory
    holding the binaries, so scripts can do BIN=$(pi2 build --engine llama.cpp | tail -1).

    \b
    Examples:
      pi2 build                                   # pi2-engine for this machine
      pi2 build --target linux-arm64              # static arm64 pi2-engine
      pi2 build --engine llama.cpp
      pi2 build --engine llama.cpp --target linux-arm64
      ANDROID_NDK_HOME=~/android-ndk-r27 pi2 build --engine llama.cpp --target android-arm64
    """
    if engine == "pi2":
        from pi2cli.builds.engine_build import ensure_engine_built

        build_dir, rebuilt = ensure_engine_built(target, jobs=jobs, android_api=android_api)
        click.echo(f"pi2-engine for {target}: {'built' if rebuilt else 'up to date'}", err=True)
        click.echo(str(build_dir / "pi2-engine"))
        return
    from pi2cli.builds.baselines.llamacpp_build import build_record, ensure_built

    bin_dir = ensure_built(target, jobs=jobs)
    record = build_record(bin_dir)
    if record:
        click.echo(
            f"llama.cpp {record.get('llama_cpp_commit')} for {target}: built in "
            f"{record.get('build_seconds')} s, cached",
            err=True,
        )
    click.echo(str(bin_dir))
