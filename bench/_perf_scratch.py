"""scratch: perf record the trio thread of the daemon / floor during one inbound flood."""
import os, signal, subprocess, sys, tempfile, trio
from pathlib import Path
sys.path.insert(0, os.path.dirname(__file__))
from harness import daemon_running, fixtures_running, forwarder_running
import bench_inbound

async def run(workdir, servers, messages, side, out):
    async with fixtures_running(workdir, servers) as fixtures:
        if side == "daemon":
            cfg = {f"s{n}": {"url": f.listen_url} for n, f in enumerate(fixtures)}
            cm = daemon_running(workdir, cfg, tag="perf")
        else:
            cm = forwarder_running(workdir, fixtures, tag="perf", journal=True)
        async with cm as (proc, socket):
            perf = subprocess.Popen(["perf", "record", "-e", "cpu-clock", "-F", "4000", "-g", "-t", str(proc.pid), "-o", str(out)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            await trio.sleep(0.5)
            measured = await bench_inbound._drive(socket, proc.pid, fixtures, messages, "perf")
            perf.send_signal(signal.SIGINT); perf.wait()
    print(side, {k: v for k, v in measured.items() if k != "latencies"})

side = sys.argv[1]; out = Path(sys.argv[2]); n = int(sys.argv[3]) if len(sys.argv) > 3 else 5000
with tempfile.TemporaryDirectory(prefix="mr-perf-", dir="/tmp") as tmp:
    trio.run(run, Path(tmp), 4, n, side, out)
