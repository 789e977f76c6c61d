"""Figure `service-slow-sync` (issue 46): the 8-client row of `service` on a disk whose every sync
takes `DELAY_US` longer, as a cloud volume's does (0.5-2 ms a sync).

Group commit exists for such disks: eight callers' reserves share one transaction and one sync,
where eight in-process callers pay one sync each. On this machine's disk a sync costs ~0.1 ms, a
small share of a cycle, so the 8-client row there measures CPU, not syncs. Here the delay is
added by a preloaded shim (`LD_PRELOAD`, built with the machine's C compiler) that sleeps after
every `fsync` and `fdatasync` of the processes it is loaded into: the service and the
in-process caller alike (both are started with it), so the comparison stays like for like.

Invariant: the shim only waits after the real call has returned (a sync still syncs); without a C
compiler the rows say skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench.common import Row, Settings, open_ledger
from bench.service import CLIENTS, QUICK_CLIENTS, _fleet_rows, _service_home
from tests.support.serving import running

LABEL = "service-slow-sync"
DELAY_US = 2000
SHIM_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

static void later(void) {
    const char *text = getenv("LEDGER_BENCH_SYNC_DELAY_US");
    long us = text ? atol(text) : 0;
    struct timespec pause = {us / 1000000, (us % 1000000) * 1000};
    if (us > 0) nanosleep(&pause, NULL);
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    int done = real(fd);
    later();
    return done;
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    int done = real(fd);
    later();
    return done;
}
"""


def _shim(where: Path) -> Path | None:
    """The shim built in `where`, or None without a C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    source, built = where / "slow_sync.c", where / "slow_sync.so"
    source.write_text(SHIM_C)
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(built), str(source), "-ldl"],
                   check=True, capture_output=True)
    return built


def run(root: Path, settings: Settings) -> list[Row]:
    """The 8-client rows with every sync `DELAY_US` longer, in the service and the caller."""
    with tempfile.TemporaryDirectory(prefix="ledger-ss-") as short:
        shim = _shim(Path(short))
        if shim is None:
            clients = QUICK_CLIENTS if settings.quick else CLIENTS
            return [Row(f"{LABEL}: {clients} client processes", "skipped", "no C compiler")]
        saved = {name: os.environ.get(name)
                 for name in ("LD_PRELOAD", "LEDGER_BENCH_SYNC_DELAY_US")}
        os.environ["LD_PRELOAD"] = str(shim)  # inherited by the service and the spawned callers
        os.environ["LEDGER_BENCH_SYNC_DELAY_US"] = str(DELAY_US)
        try:
            home = _service_home(Path(short), "svc")
            open_ledger(home).close()
            with running(home) as served:
                rows = _fleet_rows(root, settings, served.socket, label=LABEL)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    note = f"every fsync/fdatasync {DELAY_US / 1000:g} ms longer (a preloaded shim)"
    return [row.with_note(f"{row.note}; {note}" if row.note else note) for row in rows]
