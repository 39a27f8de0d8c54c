"""Chat templates come from model files, so they are untrusted code: jinja2's sandbox plus bounds on
what they build, output and how long they run. Each hostile template below fails in one Pi2Error line,
in seconds, without growing memory (run under a 1.5 GB address-space limit, where the unbounded
renderer died of MemoryError or ran on)."""

import json
import subprocess
import sys

import pytest

from pi2cli.errors import Pi2Error
from pi2cli.workloads import MAX_TEMPLATE_CHARS, render_chat

HOSTILE = [
    "{{ 'x'*4000000000 }}",
    "{{ ['x']*4000000000 }}",
    "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}",
    # no call and no output in the loop body: only the timer stops it
    "{% set x = range(100000)|list %}{% for a in x %}{% for b in x %}{% for c in x %}{% endfor %}{% endfor %}"
    "{% endfor %}",
    "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{% macro f(s) %}{{ f(s ~ s) }}{% endmacro %}{{ f('x') }}",
    "{{ 'x'|center(4000000000) }}",
    "{{ '%4000000000s' % 1 }}",
    "{{ '{:>4000000000}'.format(1) }}",
    "{{ 'x'.ljust(4000000000) }}",
    "{{ ('x'*4000000)|replace('x', 'x'*4000000) }}",
    "{{ range(100000)|map('string')|join('y'*4000000) }}",
    "{{ ([['x']*4000000] * 100000)|sum(start=[]) }}",
    "{{ (((((((((" * 10000,
    "{{ 2.0 ** 100000 }}",  # OverflowError: a Python error inside the template is its failure too
]

PROBE = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20))
from pi2cli.errors import Pi2Error
from pi2cli.workloads import render_chat
out = []
for t in json.loads(sys.argv[1]):
    t0 = time.monotonic()
    try:
        render_chat(t, [{"role": "user", "content": "hi"}])
        what = "rendered"
    except Pi2Error as e:
        what = "Pi2Error " + str(e)
    except BaseException as e:
        what = type(e).__name__
    out.append([what, time.monotonic() - t0])
print(json.dumps(out))
"""


@pytest.mark.slow
def test_hostile_templates_fail_in_one_line_fast_without_growing_memory():
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(HOSTILE)], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    for template, (what, seconds) in zip(HOSTILE, json.loads(done.stdout), strict=True):
        assert what.startswith("Pi2Error chat template failed: "), (template[:60], what)
        assert "\n" not in what and seconds < 10, (template[:60], seconds)


def test_real_templates_still_render():
    hf = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] | trim + '<|im_end|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    long = [{"role": "user", "content": "word " * 50000}] * 4  # 1M characters: a long context
    out = render_chat(hf, long)
    assert out.count("<|im_start|>") == 5 and len(out) > 1_000_000
    assert render_chat("{{ '%5d|%-3s' % (42, 'a') }}{{ 'ab' * 3 }}{{ ['x', 'y'] | join(', ') }}", []) == (
        "   42|a  abababx, y"
    )


def test_output_over_the_limit_is_refused():
    with pytest.raises(Pi2Error, match="character limit"):
        render_chat("{% for i in range(100) %}{{ m }}{% endfor %}", [], m="x" * (MAX_TEMPLATE_CHARS // 50))
