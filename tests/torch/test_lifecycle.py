"""destroy_process_group releases what init_process_group took: 200 cycles
in one process (2 ranks) leave the fd count unchanged and RSS within 5 MiB
(lifecycle.py measures and prints both)."""
import re

from conftest import run_job

HERE_SCRIPT = __file__.replace("test_lifecycle.py", "lifecycle.py")


def test_200_init_destroy_cycles():
    res = run_job(2, [200], timeout=300, script=HERE_SCRIPT)
    for out in res.outputs:
        print(out)
    res.check()
    for r, out in enumerate(res.outputs):
        m = re.search(r"fds (\d+) -> (\d+), RSS ([\d.]+) -> ([\d.]+) MiB", out)
        assert m, f"rank {r} printed no figures:\n{out}"
        assert m.group(1) == m.group(2), f"rank {r}: fd count changed: {m.group(0)}"
        assert float(m.group(4)) - float(m.group(3)) <= 5.0, f"rank {r}: RSS grew: {m.group(0)}"
