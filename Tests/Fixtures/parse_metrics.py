"""Parses a Prometheus text exposition (format 0.0.4) read from stdin with the reference
Python client's parser and prints the result as JSON on stdout, for the Swift end-to-end test
(Tests/EndToEndTests/MetricsEndToEndTests.swift).

Output: {"families": [{"name", "type", "documentation",
                       "samples": [{"name", "labels", "value"}]}]}
Counter family names lose their `_total` suffix (the parser's rule); sample names keep it.
Exit status 1 with the parser's message on stderr when the text does not parse.
"""
import json
import math
import sys

from prometheus_client.parser import text_string_to_metric_families


def main() -> int:
    text = sys.stdin.read()
    families = []
    try:
        for family in text_string_to_metric_families(text):
            samples = []
            for s in family.samples:
                if math.isnan(s.value) or math.isinf(s.value):
                    raise ValueError(f"non-finite value in {s.name}{s.labels}: {s.value}")
                samples.append({"name": s.name, "labels": dict(s.labels), "value": s.value})
            families.append({
                "name": family.name,
                "type": family.type,
                "documentation": family.documentation,
                "samples": samples,
            })
    except Exception as e:  # the parser raises ValueError and others on malformed input
        print(f"unparsable exposition: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    json.dump({"families": families}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
