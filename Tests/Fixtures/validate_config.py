"""Validates bearerd configuration files against the generated JSON Schema with a real validator.

usage: validate_config.py SCHEMA FILE...

The schema itself is first checked against the draft 2020-12 meta-schema. Each FILE is YAML:
either a bearerd.yaml, or Kubernetes manifests whose ConfigMaps hold a `bearerd.yaml` key (each
embedded file is validated, named FILE#ConfigMap/NAME). Prints one JSON object per line:
{"file": ..., "valid": true|false, "errors": ["path: message", ...]}. Exits 0 unless the schema is
invalid or a file cannot be read, so the caller asserts per file.
"""
import json
import sys

import jsonschema
import yaml


def documents(path):
    with open(path, encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    manifests = [d for d in docs if isinstance(d, dict) and "apiVersion" in d and "kind" in d]
    if not manifests:
        if len(docs) != 1:
            raise SystemExit(f"{path}: expected one YAML document, got {len(docs)}")
        yield path, docs[0]
        return
    for d in manifests:
        text = (d.get("data") or {}).get("bearerd.yaml") if d["kind"] == "ConfigMap" else None
        if text is not None:
            yield f"{path}#ConfigMap/{d['metadata']['name']}", yaml.safe_load(text)


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    with open(sys.argv[1], encoding="utf-8") as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for path in sys.argv[2:]:
        for name, doc in documents(path):
            # YAML 1.1 timestamps and the like become text, as the loader reads every scalar as text.
            doc = json.loads(json.dumps(doc, default=str))
            errors = sorted(
                "/".join(str(p) for p in e.absolute_path) + ": " + e.message
                for e in validator.iter_errors(doc)
            )
            print(json.dumps({"file": name, "valid": not errors, "errors": errors}), flush=True)


if __name__ == "__main__":
    main()
