#!/usr/bin/env python3
"""What a CTest run ran, per label, and whether CI may call it a pass.

    scripts/ctest-report.py BUILD_DIR JUNIT_FILE [--allow-skip LABEL]...

Reads the JUnit file of `ctest --output-junit` (each test's outcome) and the labels of every
test (`ctest --show-only=json-v1` in BUILD_DIR), prints the count of tests per label that
passed, failed, were skipped (SKIP_RETURN_CODE) or did not run, and exits 1 when a test was
skipped or did not run outside the allowed labels (default: gpu), or when no test ran at all.
CTest's own exit status already covers failures; this covers what CTest calls a pass: "100%
tests passed" with whole sets of tests skipped. scripts/dev test runs it when CI=true.
"""

import argparse
import collections
import json
import subprocess
import sys
import xml.etree.ElementTree as ElementTree


def labels_by_test(build_dir):
    """{test name: [labels]} for every test CTest knows in build_dir."""
    listing = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build_dir, check=True,
                             capture_output=True, text=True).stdout
    labels = {}
    for test in json.loads(listing).get("tests", []):
        names = []
        for prop in test.get("properties", []):
            if prop.get("name") == "LABELS":
                names = list(prop.get("value", []))
        labels[test["name"]] = names
    return labels


def outcomes(junit_file):
    """[(test name, outcome)], outcome one of passed, failed, skipped, not run."""
    results = []
    for case in ElementTree.parse(junit_file).getroot().iter("testcase"):
        status = case.get("status", "")
        skipped = case.find("skipped")
        if status == "run":
            outcome = "passed"
        elif status == "fail" or case.find("failure") is not None:
            outcome = "failed"
        elif skipped is not None and "SKIP_" in (skipped.get("message") or ""):
            outcome = "skipped"  # SKIP_RETURN_CODE or SKIP_REGULAR_EXPRESSION: the test said so
        else:
            outcome = "not run"  # a failed fixture or dependency, a missing executable, disabled
        results.append((case.get("name"), outcome))
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build_dir")
    parser.add_argument("junit_file")
    parser.add_argument("--allow-skip", action="append", metavar="LABEL",
                        help="a label whose tests may be skipped (default: gpu)")
    args = parser.parse_args()
    allowed = set(args.allow_skip or ["gpu"])

    try:
        results = outcomes(args.junit_file)
    except (OSError, ElementTree.ParseError) as error:
        print(f"ERROR: no readable JUnit file from CTest ({error}): nothing to count", file=sys.stderr)
        return 1
    labels = labels_by_test(args.build_dir)
    kinds = ["passed", "failed", "skipped", "not run"]
    per_label = collections.defaultdict(collections.Counter)
    total = collections.Counter()
    offenders = []
    for name, outcome in results:
        test_labels = labels.get(name, [])
        for label in test_labels or ["(no label)"]:
            per_label[label][outcome] += 1
        total[outcome] += 1
        if outcome in ("skipped", "not run") and not allowed.intersection(test_labels):
            offenders.append(f"{name} ({outcome}; labels: {', '.join(test_labels) or 'none'})")

    width = max([len("label")] + [len(label) for label in per_label])
    print(f"== tests per label ({args.junit_file})")
    print(f"{'label':<{width}}  " + "  ".join(f"{kind:>7}" for kind in kinds))
    for label in sorted(per_label):
        print(f"{label:<{width}}  " + "  ".join(f"{per_label[label][kind]:>7}" for kind in kinds))
    print(f"{'all':<{width}}  " + "  ".join(f"{total[kind]:>7}" for kind in kinds))

    sys.stdout.flush()
    ok = True
    ran = total["passed"] + total["failed"]
    if ran == 0:
        print("ERROR: no test ran (an empty selection, or every test skipped)", file=sys.stderr)
        ok = False
    if offenders:
        print(f"ERROR: {len(offenders)} test(s) outside the label(s) {', '.join(sorted(allowed))} "
              "were skipped or did not run; CI counts that as a failure:", file=sys.stderr)
        for line in offenders:
            print(f"  {line}", file=sys.stderr)
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
