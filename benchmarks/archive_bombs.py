"""Peak memory while opening and tracing bundles that hide a huge member: a gzip bomb
(N MB of zeros, a few hundred KB compressed) and a 1 GB sparse member (a few KB stored).

    python benchmarks/archive_bombs.py [MB]        # default 512

Each case runs in a fresh interpreter (peak RSS = ru_maxrss). Asserts nothing.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

CHILD = """
import resource, sys, time
sys.path.insert(0, {root!r})
from traceflow.bundle.reader import Bundle
from traceflow.cni import open_snapshot
from traceflow.questions.solver import Query, Solver
t = time.perf_counter()
b = Bundle.open({path!r})
s = open_snapshot(b); c = s.cluster; svc = c.service('backendsvc', 'default')
tr = Solver(s).trace(Query('pod-to-svc', c.pod('frontend', 'default'), svc.cluster_ip, 80, 'TCP',
                           54321, svc.key, svc))
print(f"{{time.perf_counter() - t:.1f}} {{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}}")
"""


def main() -> None:
    import gzip
    import io
    import tarfile

    from test_hostile_input import _bomb, _sparse_member
    from traceflow.cli.app import example_path
    mb = int(sys.argv[1]) if len(sys.argv) > 1 else 512
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        bomb = _bomb(tmp, mb << 20)
        plain = io.BytesIO()
        tar = tarfile.open(fileobj=plain, mode="w", format=tarfile.GNU_FORMAT)
        tar.add(example_path(), arcname="bundle")
        member = _sparse_member("bundle/nodes/worker1/sparse.txt", 1 << 30)
        tar.fileobj.write(member)
        tar.offset += len(member)
        tar.close()
        sparse = tmp / "sparse.tar.gz"
        sparse.write_bytes(gzip.compress(plain.getvalue()))
        print(f"{'case':32} {'archive KB':>10} {'seconds':>8} {'peak RSS MB':>11}")
        for label, path in ((f"gzip bomb ({mb} MB of zeros)", bomb),
                            ("sparse member (1 GB)", sparse)):
            r = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT),
                                                                   path=str(path))],
                               capture_output=True, text=True)
            if r.returncode:
                print(f"{label:32} failed: {r.stderr.strip().splitlines()[-1:]}")
                continue
            secs, rss = r.stdout.split()
            print(f"{label:32} {path.stat().st_size // 1024:>10} {secs:>8} {rss:>11}")



if __name__ == "__main__":
    main()
