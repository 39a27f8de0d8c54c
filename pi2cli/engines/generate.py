"""`pi2 generate` for every engine: one turn of the driver's own chat session on this machine.

The prompt goes to the session as it is (no chat template: `pi2 generate` takes raw text), through
the same Driver.open_chat / ChatSession.turn path as every bench turn, so an engine has one way to
run and one way to be measured. The turn stops at end-of-generation (ignore_eos off), as a plain
generation does; the bench's turns run to their full length instead.
"""

from __future__ import annotations

from pi2cli.engines.base import Driver, GenerateRequest, GenerateResult, TurnFailed
from pi2cli.errors import Pi2Error


def generate(driver: Driver, request: GenerateRequest, target=None) -> GenerateResult:
    """Run `request` through `driver` on `target` (this machine by default) and return what it made."""
    from pi2cli.hw.cgroup import Budget
    from pi2cli.targets import get_target

    target = target or get_target("local")
    why_not = driver.supports(target)
    if why_not:
        raise Pi2Error(why_not)
    model, n_ctx = driver.prepare_generate(target, request)
    # no budget: the record says so (enforced false), as the bench's results do for unbudgeted runs
    with Budget(None) as cgroup:
        session = driver.open_chat(target, model, binary_dir=None, threads=request.threads, n_ctx=n_ctx,
                                   cgroup=cgroup, seed=request.seed, temperature=request.temperature)  # fmt: skip
        try:
            turn = session.turn(request.prompt, request.n_predict, ignore_eos=False)
        except TurnFailed as exc:
            session.kill()
            raise Pi2Error(str(exc)) from None
        except BaseException:
            session.kill()
            raise
        counters = session.close()
    return GenerateResult(
        engine=driver.name,
        turn=turn,
        peak_rss_bytes=counters.get("peak_rss_bytes") or 0,
        how=driver.how,
        extra={
            **driver.extra_settings,
            "timings": turn.timings,
            "stop_type": turn.stop_type,
            "load_s": counters.get("load_s"),
            "peak_rss_source": counters.get("peak_rss_source"),
            "budget": cgroup.record(),
            **driver.generate_extra(session, turn),
        },
    )
