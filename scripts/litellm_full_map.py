#!/usr/bin/env python3
"""Import LiteLLM's whole price map (issue 13 item 5) and print what the conversion did.

The map ships inside the litellm wheel as `litellm/model_prices_and_context_window_backup.json`.
Tests never download it; this script reads it from a wheel file (`pip download litellm --no-deps`),
from the JSON file itself, or from an installed `litellm` package, converts it exactly as
`ledger catalog import-litellm` does (nothing is written), and prints the counts.

Usage: python scripts/litellm_full_map.py [WHEEL_OR_JSON] [--json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

from ledger.litellm import convert, parse_litellm

MAP_IN_WHEEL = "litellm/model_prices_and_context_window_backup.json"


def read_map(source: str | None) -> bytes:
    """The map's bytes from a wheel, a JSON file, or the installed litellm package."""
    if source is None:
        spec = importlib.util.find_spec("litellm")
        if spec is None or spec.origin is None:
            raise SystemExit("litellm is not installed: pass a wheel or the JSON file")
        return (Path(spec.origin).parent / Path(MAP_IN_WHEEL).name).read_bytes()
    path = Path(source)
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            return wheel.read(MAP_IN_WHEEL)
    return path.read_bytes()


def counts(raw: bytes) -> dict[str, Any]:
    """What importing the whole map gives: entries, aliases, models, providers, timings."""
    started = time.perf_counter()
    document = parse_litellm(raw)
    result = convert(document)
    elapsed = time.perf_counter() - started
    catalog = result.catalog
    no_url = catalog.providers_without_base_url()
    apis = Counter(p.api for p in catalog.providers.values())
    return {
        "entries": len(document),
        "aliasEntries": sum(
            1 for v in document.values() if isinstance(v, dict) and "alias_of" in v
        ),
        "aliasesFollowed": result.aliases,
        "imported": result.imported,
        "skipped": result.skipped,
        "skippedByReason": dict(result.skipped_by_reason),
        "conflictingDuplicates": list(result.conflicting_duplicates),
        "providers": len(catalog.providers),
        "providersByApi": dict(sorted(apis.items())),
        "providersWithBaseUrl": len(catalog.providers) - len(no_url),
        "providersWithoutBaseUrl": len(no_url),
        "modelsOfferable": sum(1 for m in catalog.models if m.provider not in no_url),
        "convertSeconds": round(elapsed, 3),
    }


def main(argv: list[str] | None = None) -> int:
    """Print the counts as text or JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", help="litellm wheel or the JSON map")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    report = counts(read_map(args.source))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for key, value in report.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
