#!/usr/bin/env python3
"""validate_manifests.py [--expect-fail] FILE...

Validates Kubernetes manifests offline, as the cluster would and more:
  - ${VAR} placeholders are filled as `envsubst` would, with sample values
    (SAMPLES below); any other ${...} is an error;
  - core kinds (Secret, ...) against Kubernetes 1.35's schemas with
    kubernetes-validate (strict: an unknown field is an error);
  - a RayCluster against deploy/k8s/schema/raycluster-kuberay-v1.6.2.schema.json
    (our schema of KubeRay v1.6.2's CRD), then KubeRay v1.6.2's own checks
    across fields (ValidateRayClusterSpec in controllers/ray/utils/validation.go),
    then each pod template as a core/v1 PodTemplate (kubernetes-validate,
    strict), then slicetrain's rules: Ray's token authentication is on; the
    run token reaches slicetrain as a
    file (a Secret volume of mode 0400 or 0600, SLICETRAIN_TOKEN_FILE inside
    it), never as an environment variable; no fsGroup (it would make the
    token file group-readable, which slicetrain refuses); the Secrets it names
    exist (in deploy/k8s/secrets.yaml, or among the files given).
Prints "valid FILE: ..." or "invalid FILE: REASON" per file. Exit status 0
when every file is valid, or with --expect-fail when every file is invalid.
"""
import json
import os
import re
import sys

import jsonschema
import kubernetes_validate
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
K8S_VERSION = "1.35.0"  # the tutorial's GKE 1.35
SCHEMA = os.path.join(ROOT, "deploy", "k8s", "schema", "raycluster-kuberay-v1.6.2.schema.json")
SECRETS = os.path.join(ROOT, "deploy", "k8s", "secrets.yaml")
SAMPLES = {
    "IMAGE": "us-docker.pkg.dev/my-project/slicetrain/slicetrain-ray:2.60.0",
    "KSA_NAME": "slicetrain-ksa",
    "GS_BUCKET": "my-checkpoint-bucket",
    "SLICETRAIN_RAY_TOKEN": "0123456789abcdef0123456789abcdef",
    "SLICETRAIN_RUN_TOKEN": "fedcba9876543210fedcba9876543210",
}
MIN_RAY_FOR_TOKEN = (2, 52, 0)
QUALIFIED_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                            r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class Invalid(Exception):
    pass


def envsubst(text):
    def sub(m):
        name = m.group(1)
        if name not in SAMPLES:
            raise Invalid(f"unknown placeholder ${{{name}}}")
        return SAMPLES[name]
    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", sub, text)


def load(path):
    try:
        docs = [d for d in yaml.safe_load_all(envsubst(open(path).read())) if d is not None]
    except yaml.YAMLError as e:
        raise Invalid(f"not YAML: {e}") from None
    for d in docs:
        if not isinstance(d, dict) or "kind" not in d or "apiVersion" not in d:
            raise Invalid("a document without apiVersion and kind")
    return docs


def core(doc, where):
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.utils.ValidationError as e:
        path = "/".join(str(p) for p in e.path)
        raise Invalid(f"{where}: {e.message}" + (f" (at {path})" if path else "")) from None
    except (kubernetes_validate.utils.SchemaNotFoundError, kubernetes_validate.utils.InvalidSchemaError) as e:
        raise Invalid(f"{where}: no Kubernetes {K8S_VERSION} schema for {doc.get('apiVersion')}/{doc.get('kind')}: "
                      f"{e}") from None


def version_tuple(v):
    m = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", v or "")
    if not m:
        return None
    return tuple(int(x or 0) for x in m.groups())


def kuberay_rules(spec):
    """KubeRay v1.6.2's ValidateRayClusterSpec, the checks across fields."""
    groups = [("Head", spec["headGroupSpec"])] + [(g["groupName"], g) for g in spec.get("workerGroupSpecs", [])]
    for name, g in groups:
        rsp = g.get("rayStartParams") or {}
        if any(rsp.get(k) for k in ("num-cpus", "num-gpus", "memory", "resources")) and g.get("resources"):
            raise Invalid(f"resource fields should not be set in both rayStartParams and Resources for {name} group")
        if "labels" in rsp:
            raise Invalid(f"rayStartParams['labels'] is not supported for {name} group; use the Labels field")
        for k, v in (g.get("labels") or {}).items():
            if not QUALIFIED_NAME.match(k) or len(k.split("/")[-1]) > 63:
                raise Invalid(f"invalid label key for {name} group: '{k}'")
            if len(v) > 63 or not LABEL_VALUE.match(v):
                raise Invalid(f"invalid label value for key '{k}' in {name} group: '{v}'")
    seen = set()
    for g in spec.get("workerGroupSpecs", []):
        n = g["groupName"]
        if n in seen:
            raise Invalid(f"two worker groups named {n}")
        seen.add(n)
        if g["minReplicas"] > g["maxReplicas"]:
            raise Invalid(f"worker group {n} has minReplicas {g['minReplicas']} greater than maxReplicas "
                          f"{g['maxReplicas']}")
        r = g.get("replicas", 0)
        if not g["minReplicas"] <= r <= g["maxReplicas"]:  # ours: KubeRay would clamp it
            raise Invalid(f"worker group {n}: replicas {r} is outside [minReplicas, maxReplicas]")
    auth = spec.get("authOptions") or {}
    if auth.get("mode") == "token":
        v = version_tuple(spec.get("rayVersion"))
        if spec.get("rayVersion") in (None, ""):
            raise Invalid("authOptions.mode is 'token' but RayVersion was not specified. Ray version 2.52.0 or "
                          "later is required")
        if v is None:
            raise Invalid(f"authOptions.mode is 'token' but RayVersion format is invalid: {spec['rayVersion']}")
        if v < MIN_RAY_FOR_TOKEN:
            raise Invalid(f"authOptions.mode is 'token' but minimum Ray version is 2.52.0, got {spec['rayVersion']}")
        if auth.get("enableK8sTokenAuth") and auth.get("secretName"):
            raise Invalid("authOptions.enableK8sTokenAuth is enabled and authOptions.secretName is also set")
    elif auth.get("enableK8sTokenAuth"):
        raise Invalid("authOptions.enableK8sTokenAuth is enabled but authOptions.mode not set to 'token'")


def slicetrain_rules(spec, secrets):
    """The run token is a file from a Secret, never an environment variable."""
    auth = spec.get("authOptions") or {}
    if auth.get("mode") != "token":
        raise Invalid("Ray's token authentication is off (authOptions.mode: token): anyone who reaches the "
                      "dashboard could run commands on the cluster (CVE-2023-48022)")
    if auth.get("secretName"):
        s = secrets.get(auth["secretName"])
        if s is None:
            raise Invalid(f"authOptions.secretName {auth['secretName']}: no such Secret")
        if "auth_token" not in (s.get("stringData") or {}) and "auth_token" not in (s.get("data") or {}):
            raise Invalid(f"Secret {auth['secretName']} has no key auth_token (KubeRay's authOptions reads it)")
    workers = spec.get("workerGroupSpecs", [])
    if not workers:
        raise Invalid("no worker group: slicetrain's hosts are the worker pods")
    for name, g in [("head", spec["headGroupSpec"])] + [(w["groupName"], w) for w in workers]:
        pod = g["template"]["spec"]
        if (pod.get("securityContext") or {}).get("fsGroup") is not None:
            raise Invalid(f"{name}: fsGroup makes the run token's file group-readable, which slicetrain refuses")
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        for c in pod["containers"] + pod.get("initContainers", []):
            env = {e["name"]: e for e in c.get("env", [])}
            if "SLICETRAIN_TOKEN" in env:
                raise Invalid(f"{name}/{c['name']}: SLICETRAIN_TOKEN in the environment: the run token must be a "
                              "file (SLICETRAIN_TOKEN_FILE, a Secret volume)")
            for ef in c.get("envFrom", []):
                sr = (ef.get("secretRef") or {}).get("name")
                if sr and sr in secrets and "token" in (secrets[sr].get("stringData") or secrets[sr].get("data") or {}):
                    raise Invalid(f"{name}/{c['name']}: envFrom Secret {sr} puts the run token in the environment")
            if name == "head":
                continue
            tf = (env.get("SLICETRAIN_TOKEN_FILE") or {}).get("value")
            if not tf:
                raise Invalid(f"{name}/{c['name']}: no SLICETRAIN_TOKEN_FILE: every slicetrain process needs the "
                              "run token")
            mount = next((m for m in c.get("volumeMounts", [])
                          if tf.startswith(m["mountPath"].rstrip("/") + "/")), None)
            if mount is None:
                raise Invalid(f"{name}/{c['name']}: SLICETRAIN_TOKEN_FILE={tf} is in no mounted volume")
            sec = vols.get(mount["name"], {}).get("secret")
            if sec is None:
                raise Invalid(f"{name}/{c['name']}: SLICETRAIN_TOKEN_FILE={tf} is not in a Secret volume")
            if sec.get("secretName") not in secrets:
                raise Invalid(f"{name}: Secret {sec.get('secretName')}: no such Secret")
            mode = sec.get("defaultMode", 0o644)
            for it in sec.get("items", []):
                if tf.endswith("/" + it["path"]):
                    mode = it.get("mode", mode)
            if mode & 0o077:
                raise Invalid(f"{name}: the run token's Secret volume has mode {mode:04o}: slicetrain refuses a "
                              "token file that grants anything to group or others (0400 or 0600)")


def raycluster(doc, secrets):
    try:
        jsonschema.validate(doc, json.load(open(SCHEMA)), cls=jsonschema.Draft202012Validator)
    except jsonschema.ValidationError as e:
        path = "/".join(str(p) for p in e.absolute_path)
        raise Invalid(f"RayCluster (KubeRay v1.6.2 schema): {e.message}" + (f" (at {path})" if path else "")) from None
    spec = doc["spec"]
    kuberay_rules(spec)
    groups = [("headGroupSpec", spec["headGroupSpec"])] + [
        (f"workerGroupSpecs/{g['groupName']}", g) for g in spec.get("workerGroupSpecs", [])]
    for where, g in groups:
        core({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": g["template"]},
             f"RayCluster {where} template (core/v1 PodTemplateSpec)")
    slicetrain_rules(spec, secrets)


def check(path, secrets):
    docs = load(path)
    local = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "Secret" and isinstance(d.get("metadata"), dict)}
    kinds = []
    for d in docs:
        if d["kind"] == "RayCluster":
            raycluster(d, {**secrets, **local})
        else:
            core(d, f"{d['apiVersion']}/{d['kind']} {d.get('metadata', {}).get('name', '?')}")
        kinds.append(f"{d['kind']} {d.get('metadata', {}).get('name', '?')}")
    return kinds


def main():
    args = sys.argv[1:]
    expect_fail = bool(args) and args[0] == "--expect-fail"
    files = args[1:] if expect_fail else args
    secrets = {d["metadata"]["name"]: d for d in load(SECRETS) if d["kind"] == "Secret"}
    ok = True
    for f in files:
        try:
            kinds = check(f, secrets)
            print(f"valid {os.path.relpath(f, ROOT)}: {', '.join(kinds)}")
            ok &= not expect_fail
        except Invalid as e:
            print(f"invalid {os.path.relpath(f, ROOT)}: {e}")
            ok &= expect_fail
    sys.exit(0 if ok and files else 1)


if __name__ == "__main__":
    main()
