"""Offline checks of infra/ (scripts/validate-infra.sh runs this in the infra tools' venv).

Stages, each timed; the script exits 1 when any fails:
  lint       helm lint --strict of the chart (default values, ci/*-values.yaml)
  render     the chart rendered without a cluster (helm-python-sdk) for the default values and
             for every ci/*-values.yaml; every document must parse and name apiVersion, kind and
             metadata.name; bad values must be refused by values.schema.json
  kubernetes every rendered manifest and infra/kserve/*.yaml against the Kubernetes schemas of
             several versions (kubernetes-validate, strict); custom resources (Prometheus
             Operator, KServe) against schemas of their own below, their pod specs against
             Kubernetes' Container and PodSecurityContext schemas
  flags      every TESSERA_* variable and --flag the manifests give a `tessera <role>` is one
             that role's --help lists (a role the binary does not have yet is reported, not
             failed: the gateway)
  checkov    rendered manifests, infra/kserve and the Dockerfile (suppressions sit next to what
             they suppress, with their reason)
  hadolint   infra/docker/Dockerfile
  yamllint   infra/ YAML (not Helm templates, which are not YAML until rendered)
  metrics    every metric the Grafana dashboard and the alert rules query is one a live control
             plane, worker (with a fake NVML GPU in MIG mode) or `tessera serve` exports, and
             every label they match on is one it carries; the chart's NVML-vs-grant check runs
             against the fake NVML too, and the images' HEALTHCHECK script against the roles

Usage: validate_infra.py [--out DIR] [--only STAGE,...] [--tessera-bin PATH]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "infra"
CHART = INFRA / "helm" / "tessera"
KSERVE = INFRA / "kserve"
DOCKERFILE = INFRA / "docker" / "Dockerfile"
DASHBOARD = CHART / "files" / "grafana-dashboard.json"
RULES = CHART / "files" / "prometheus-rules.yaml"

# Kubernetes versions the chart supports (Chart.yaml kubeVersion >= 1.29): the oldest, a middle
# one and the newest kubernetes-validate knows.
KUBE_VERSIONS = ["1.29.0", "1.33.0", "1.37.0"]
RELEASE, NAMESPACE = "tessera", "tessera"
# What a default install must be given: Postgres (an external database; there is no default).
DEFAULT_REQUIRED = {"postgres": {"url": "postgres://tessera:secret@postgres.example.com:5432/tessera?sslmode=require"}}


def say(msg: str) -> None:
    print(f"[infra] {msg}", file=sys.stderr, flush=True)


class Failed(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------


def values_sets() -> dict[str, dict]:
    """Named value sets: the defaults (plus the one required value) and each ci/*-values.yaml."""
    sets = {"default": copy.deepcopy(DEFAULT_REQUIRED)}
    for path in sorted((CHART / "ci").glob("*-values.yaml")):
        sets[path.name.removesuffix("-values.yaml")] = yaml.safe_load(path.read_text()) or {}
    return sets


def render(values: dict) -> dict[str, str]:
    import helm_python

    chart = helm_python.Chart.load(str(CHART))
    return chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)


def documents(rendered: dict[str, str]) -> list[tuple[str, dict]]:
    docs = []
    for template, text in sorted(rendered.items()):
        if not template.endswith((".yaml", ".yml")):
            continue
        for doc in yaml.safe_load_all(text):
            if doc is None:
                continue
            for key in ("apiVersion", "kind"):
                if key not in doc:
                    raise Failed(f"{template}: a document without {key}")
            if not doc.get("metadata", {}).get("name"):
                raise Failed(f"{template}: {doc['kind']} without metadata.name")
            docs.append((template, doc))
    return docs


# Values that values.schema.json (or a template's `fail`) must refuse, with a piece of the error.
BAD_VALUES = [
    ("no database", {}, "postgres"),
    ("replicas as text", {"controlPlane": {"replicas": "two"}}, "replicas"),
    ("unknown key", {"controlPlane": {"replicaz": 2}}, "replicaz"),
    ("pool kind", {"workers": {"pools": [{"name": "t", "kind": "tpu", "resources": {}}]}}, "kind"),
    ("gpu pool without gpus", {"workers": {"pools": [{"name": "g", "kind": "gpu", "resources": {}}]}}, "gpus"),
    ("mig pool with a bad profile",
     {"workers": {"pools": [{"name": "m", "kind": "mig", "mig": {"one-g": 1}, "resources": {}}]}}, "one-g"),
    ("cpu pool asking for GPUs", {"workers": {"pools": [{"name": "c", "kind": "cpu", "gpus": 1, "resources": {}}]}}, "pools"),
    ("object store", {"objectStore": {"provider": "minio", "bucket": "abc"}}, "provider"),
    ("azure without an account", {"objectStore": {"provider": "azure", "bucket": "abc"}}, "azureAccount"),
    ("object store prefix", {"objectStore": {"prefix": "/models/"}}, "prefix"),
    ("pool name", {"workers": {"pools": [{"name": "CPU_Pool", "kind": "cpu", "resources": {}}]}}, "name"),
    ("duplicate pool",
     {"workers": {"pools": [{"name": "a", "kind": "cpu", "resources": {"limits": {"memory": "1Gi"}}},
                            {"name": "a", "kind": "cpu", "resources": {"limits": {"memory": "1Gi"}}}]}}, "twice"),
]


def merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# ---------------------------------------------------------------------------------------------
# Schemas of the custom resources (the parts Tessera uses; unknown fields are refused)
# ---------------------------------------------------------------------------------------------

_str = {"type": "string"}
_labels = {"type": "object", "additionalProperties": _str}
_meta = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
    "namespace": _str, "labels": _labels, "annotations": _labels}, "additionalProperties": False}
_duration = {"type": "string", "pattern": "^(([0-9]+)(ms|s|m|h|d|w|y))+$"}
_selector = {"type": "object", "properties": {
    "matchLabels": _labels,
    "matchExpressions": {"type": "array", "items": {"type": "object", "required": ["key", "operator"], "properties": {
        "key": _str, "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
        "values": {"type": "array", "items": _str}}, "additionalProperties": False}}},
    "additionalProperties": False}
_auth = {"type": "object", "properties": {"type": _str, "credentials": {
    "type": "object", "required": ["name", "key"],
    "properties": {"name": _str, "key": _str, "optional": {"type": "boolean"}}, "additionalProperties": False}},
    "additionalProperties": False}
_relabel = {"type": "object", "properties": {
    "sourceLabels": {"type": "array", "items": _str}, "targetLabel": _str, "regex": _str, "replacement": _str,
    "separator": _str, "action": _str}, "additionalProperties": False}
_endpoint = {"type": "object", "required": ["port"], "properties": {
    "port": _str, "path": _str, "interval": _duration, "scrapeTimeout": _duration, "authorization": _auth,
    "relabelings": {"type": "array", "items": _relabel}}, "additionalProperties": False}
_rule = {"type": "object", "required": ["expr"], "properties": {
    "record": {"type": "string", "pattern": "^[a-zA-Z_:][a-zA-Z0-9_:]*$"},
    "alert": {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9_]*$"},
    "expr": {"type": "string", "minLength": 1}, "for": _duration, "keep_firing_for": _duration,
    "labels": _labels, "annotations": _labels},
    "oneOf": [{"required": ["record"]}, {"required": ["alert"]}], "additionalProperties": False}
_rule_groups = {"type": "object", "required": ["groups"], "properties": {"groups": {"type": "array", "minItems": 1, "items": {
    "type": "object", "required": ["name", "rules"], "properties": {
        "name": _str, "interval": _duration, "rules": {"type": "array", "minItems": 1, "items": _rule}},
    "additionalProperties": False}}}, "additionalProperties": False}
_resources = {"type": "object", "properties": {"requests": {"type": "object"}, "limits": {"type": "object"}},
              "additionalProperties": False}


def _cr(api_version: str, kind: str, spec: dict) -> dict:
    return {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "properties": {
        "apiVersion": {"const": api_version}, "kind": {"const": kind}, "metadata": _meta, "spec": spec},
        "additionalProperties": False}


CR_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _cr("monitoring.coreos.com/v1", "ServiceMonitor", {
        "type": "object", "required": ["selector", "endpoints"], "properties": {
            "selector": _selector, "namespaceSelector": {"type": "object", "properties": {
                "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": _str}}, "additionalProperties": False},
            "endpoints": {"type": "array", "minItems": 1, "items": _endpoint}}, "additionalProperties": False}),
    ("monitoring.coreos.com/v1", "PodMonitor"): _cr("monitoring.coreos.com/v1", "PodMonitor", {
        "type": "object", "required": ["selector", "podMetricsEndpoints"], "properties": {
            "selector": _selector, "namespaceSelector": {"type": "object", "properties": {
                "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": _str}}, "additionalProperties": False},
            "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": _endpoint}}, "additionalProperties": False}),
    ("monitoring.coreos.com/v1", "PrometheusRule"): _cr("monitoring.coreos.com/v1", "PrometheusRule", _rule_groups),
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): _cr("serving.kserve.io/v1alpha1", "ServingRuntime", {
        "type": "object", "required": ["supportedModelFormats", "containers"], "properties": {
            "multiModel": {"type": "boolean"}, "disabled": {"type": "boolean"},
            "protocolVersions": {"type": "array", "items": {"enum": ["v1", "v2", "grpc-v1", "grpc-v2"]}},
            "supportedModelFormats": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["name"], "properties": {
                    "name": _str, "version": _str, "autoSelect": {"type": "boolean"}, "priority": {"type": "integer", "minimum": 1}},
                "additionalProperties": False}},
            "containers": {"type": "array", "minItems": 1},  # checked as Kubernetes containers below
            "securityContext": {"type": "object"}, "nodeSelector": _labels, "tolerations": {"type": "array"}},
        "additionalProperties": False}),
    ("serving.kserve.io/v1beta1", "InferenceService"): _cr("serving.kserve.io/v1beta1", "InferenceService", {
        "type": "object", "required": ["predictor"], "properties": {"predictor": {
            "type": "object", "required": ["model"], "properties": {
                "minReplicas": {"type": "integer", "minimum": 0}, "maxReplicas": {"type": "integer", "minimum": 1},
                "model": {"type": "object", "required": ["modelFormat"], "properties": {
                    "modelFormat": {"type": "object", "required": ["name"], "properties": {"name": _str, "version": _str},
                                    "additionalProperties": False},
                    "runtime": _str, "protocolVersion": {"enum": ["v1", "v2", "grpc-v2"]}, "storageUri": _str,
                    "resources": _resources}, "additionalProperties": False}},
            "additionalProperties": False}}, "additionalProperties": False}),
}


def validate_kubernetes(doc: dict, where: str, errors: list[str]) -> str:
    """Validates one document; returns what it was checked against."""
    import kubernetes_validate

    schema = CR_SCHEMAS.get((doc.get("apiVersion"), doc.get("kind")))
    if schema is not None:
        try:
            jsonschema.validate(doc, schema)
        except jsonschema.ValidationError as e:
            errors.append(f"{where}: {doc['kind']}/{doc['metadata']['name']}: {'.'.join(map(str, e.path))}: {e.message}")
        if doc["kind"] == "ServingRuntime":
            # Its pod spec is a Kubernetes pod spec: check it as one.
            spec = doc["spec"]
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": doc["metadata"]["name"]},
                   "spec": {"containers": spec["containers"],
                            **({"securityContext": spec["securityContext"]} if "securityContext" in spec else {})}}
            validate_kubernetes(pod, where + " (ServingRuntime pod spec)", errors)
        return "own schema"
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            errors.append(f"{where}: {doc['kind']}/{doc['metadata']['name']} against {version}: {path}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError:
            errors.append(f"{where}: no schema for {doc['apiVersion']} {doc['kind']} in Kubernetes {version}")
    return "kubernetes"


# ---------------------------------------------------------------------------------------------
# Flags and environment against `tessera <role> --help`
# ---------------------------------------------------------------------------------------------

# Variables the manifests set for other reasons than tessera's flags.
NOT_FLAGS = {"TESSERA_NODE_NAME": "only expanded into TESSERA_WORKER_ID"}


def role_help(binary: str, role: str, cache: dict) -> str | None:
    if role not in cache:
        run = subprocess.run([binary, role, "--help"], capture_output=True, text=True, timeout=30)
        cache[role] = run.stdout if run.returncode == 0 else None
    return cache[role]


def check_container_flags(binary: str, doc: dict, where: str, cache: dict, errors: list[str], notes: list[str]):
    spec = doc.get("spec", {})
    pod = spec.get("template", {}).get("spec") if "template" in spec else (spec if "containers" in spec else None)
    if pod is None and doc.get("kind") == "ServingRuntime":
        pod = spec
    for c in (pod or {}).get("containers", []):
        args = list(c.get("args", []))
        if "--" in args:  # the inventory check wrapper: `PROFILE=N... -- tessera <role> ...`
            args = args[args.index("--") + 2:]
        if not args:
            continue
        role, flags = args[0], [a.split("=", 1)[0] for a in args[1:] if a.startswith("--")]
        text = role_help(binary, role, cache)
        if text is None:
            notes.append(f"{where}: `tessera {role}` does not exist in this binary yet; its flags were not checked")
            continue
        envs = [e["name"] for e in c.get("env", []) if e["name"].startswith("TESSERA_") and e["name"] not in NOT_FLAGS]
        for env in envs:
            if f"[env: {env}=" not in text and f"[env: {env}]" not in text:  # secrets hide their value
                errors.append(f"{where}: container {c['name']} sets {env}, which `tessera {role}` does not read")
        for flag in flags:
            if not re.search(rf"(^|\s){re.escape(flag)}([ =<,]|$)", text, re.M):
                errors.append(f"{where}: container {c['name']} passes {flag}, which `tessera {role}` does not take")


# ---------------------------------------------------------------------------------------------
# Metric names in PromQL
# ---------------------------------------------------------------------------------------------

PROMQL_WORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                "offset", "inf", "nan", "atan2", "start", "end"}


def promql_selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names it matches on) for every selector in a PromQL expression."""
    expr = re.sub(r"\$\{[^}]*\}|\$\w+", "1m", expr)  # Grafana variables
    out = []
    # Matchers first, then drop them (their values may hold anything).
    matchers = {}

    def keep(m):
        key = f"@{len(matchers)}@"
        matchers[key] = {lm.group(1) for lm in re.finditer(r'(\w+)\s*(?:=~|!~|!=|=)\s*"', m.group(0))}
        return key

    expr = re.sub(r"\{[^}]*\}", keep, expr)
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(@\d+@)?(\s*\()?", expr):
        name, matcher, call = m.group(1), m.group(2), m.group(3)
        if call or name in PROMQL_WORDS:
            continue
        out.append((name, matchers.get(matcher, set()) if matcher else set()))
    # A selector that is only matchers ({__name__=...}) is not used here.
    return out


def queried_metrics() -> tuple[dict[str, set[str]], set[str]]:
    """Metric -> label names matched, from the dashboard and the rules; and the recorded names."""
    exprs: list[tuple[str, str]] = []
    dash = json.loads(DASHBOARD.read_text())

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    exprs.append((f"dashboard panel {p.get('title')!r}", t["expr"]))
            walk(p.get("panels", []))

    walk(dash.get("panels", []))
    for var in dash.get("templating", {}).get("list", []):
        q = var.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if var.get("type") == "query" and q:
            m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", q)
            if not m:
                raise Failed(f"dashboard variable {var['name']}: cannot read query {q!r}")
            exprs.append((f"dashboard variable {var['name']}", m.group(1)))
            exprs.append((f"dashboard variable {var['name']}", f'{m.group(1).split("{")[0]}{{{m.group(2)}=~".*"}}'))
    rules = yaml.safe_load(RULES.read_text())
    recorded = set()
    for g in rules["groups"]:
        for r in g["rules"]:
            exprs.append((f"rule {r.get('alert') or r.get('record')}", r["expr"]))
            if "record" in r:
                recorded.add(r["record"])
    used: dict[str, set[str]] = {}
    for where, expr in exprs:
        for name, labels in promql_selectors(expr):
            used.setdefault(name, set()).update(labels)
    if not used:
        raise Failed("no metric found in the dashboard and rules: the PromQL reader is broken")
    return used, recorded


def parse_exposition(text: str, into: dict[str, set[str]]) -> None:
    """Sample names -> label names, from Prometheus text; `# TYPE` families count too."""
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            names = [name] + ([f"{name}_bucket", f"{name}_sum", f"{name}_count"] if kind.strip() == "histogram" else [])
            for n in names:
                into.setdefault(n, set())
            continue
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s", line)
        if m:
            labels = set(re.findall(r'(\w+)="', m.group(3) or ""))
            into.setdefault(m.group(1), set()).update(labels)


# ---------------------------------------------------------------------------------------------
# A live Tessera: `tessera dev` (control plane + worker + demo model), a second worker on a fake
# NVML (an H200 in MIG mode, so GPU and slice metrics show), and `tessera serve`
# ---------------------------------------------------------------------------------------------


class Live:
    def __init__(self, binary: str, work: Path):
        self.binary, self.work, self.procs = binary, work, []
        self.env = {**os.environ, "RUST_LOG": "info", "NO_COLOR": "1", "TESSERA_LOG_FORMAT": "text"}

    def start(self, name: str, args: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.work / f"{name}.log", "w")
        p = subprocess.Popen([self.binary, *args], stdout=log, stderr=subprocess.STDOUT, env={**self.env, **(env or {})},
                             cwd=self.work)
        p.log_path = self.work / f"{name}.log"  # type: ignore[attr-defined]
        self.procs.append(p)
        return p

    def wait_log(self, p, pattern: str, timeout_s: float = 90.0) -> re.Match:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            m = re.search(pattern, p.log_path.read_text(errors="replace"))
            if m:
                return m
            if p.poll() is not None:
                break
            time.sleep(0.1)
        tail = "\n".join(p.log_path.read_text(errors="replace").splitlines()[-30:])
        raise Failed(f"{p.args[1]} did not log {pattern!r} (exit {p.poll()}):\n{tail}")

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()


def http(method: str, url: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def fake_nvml(work: Path) -> Path:
    out = work / "nvml" / "libnvidia-ml.so.1"
    out.parent.mkdir(parents=True, exist_ok=True)
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise Failed("no C compiler (cc) to build tests/fake_nvml/fake_nvml.c")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(ROOT / "tests/fake_nvml/fake_nvml.c")], check=True)
    return out


def scrape_live(binary: str, work: Path, want: set[str]) -> dict[str, dict[str, set[str]]]:
    """Starts the three roles, makes traffic, returns {role: {sample name: label names}}.
    Scrapes again (up to 20 s) while a name in `want` is missing: usage ships and GPUs are
    sampled once a second, scheduler gauges follow ticks."""
    live = Live(binary, work)
    try:
        dev = live.start("dev", ["dev", "--data-dir", str(work / "dev"), "--listen", "127.0.0.1:0",
                                 "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
                                 "--gateway-http-port", "0", "--gateway-grpc-port", "0",
                                 "--gateway-metrics-port", "0"])
        live.wait_log(dev, r"tessera dev is ready", 120)
        banner = dev.log_path.read_text()
        api = re.search(r"REST API\s+(http://[0-9.:]+)/v1", banner).group(1)
        # The worker's line, not the gateway's above it.
        whttp = re.search(r"worker\s+KServe v2 HTTP ([0-9.]+:\d+)", banner).group(1)
        wmetrics = re.search(r"worker\s+KServe v2 HTTP .*metrics (http://[0-9.:]+/metrics)", banner).group(1)
        ghttp = re.search(r"gateway\s+KServe v2 HTTP ([0-9.]+:\d+)", banner).group(1)
        gwmetrics = re.search(r"gateway\s+KServe v2 HTTP .*metrics (http://[0-9.:]+/metrics)", banner).group(1)
        creds = json.loads((work / "dev" / "dev-credentials.json").read_text())
        secrets = json.loads((work / "dev" / "secrets.json").read_text())
        key = next(v for k, v in creds.items() if "inference" in k and isinstance(v, str) and v.startswith("tsk_"))
        # Traffic: answered requests and a failed one (a wrong shape is refused before the model;
        # a request past the batch size reaches it and fails there).
        body = {"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
                           for n in ("INPUT0", "INPUT1")]}
        hdrs = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        for _ in range(5):
            status, text = http("POST", f"http://{whttp}/v2/models/simple/infer", json.dumps(body).encode(), hdrs)
            if status != 200:
                raise Failed(f"dev worker infer: HTTP {status} {text[:200]!r}")
        # The same through the gateway, and one it refuses (an unknown model).
        for _ in range(5):
            status, text = http("POST", f"http://{ghttp}/v2/models/simple/infer", json.dumps(body).encode(), hdrs)
            if status != 200:
                raise Failed(f"dev gateway infer: HTTP {status} {text[:200]!r}")
        http("POST", f"http://{ghttp}/v2/models/missing/infer", json.dumps(body).encode(), hdrs)
        # A throttled request: the demo tenant down to 1 request per second, then a burst.
        admin = {"Authorization": f"Bearer {secrets['platform_admin_key']}", "Content-Type": "application/json"}
        status, text = http("GET", f"{api}/v1/tenants/demo/quotas", None, admin)
        if status != 200:
            raise Failed(f"demo quotas: HTTP {status} {text[:200]!r}")
        limits = {**json.loads(text)["limits"], "requests_per_second": 1}
        http("PUT", f"{api}/v1/tenants/demo/quotas", json.dumps(limits).encode(), admin)
        deadline = time.monotonic() + 15
        while http("POST", f"http://{ghttp}/v2/models/simple/infer", json.dumps(body).encode(), hdrs)[0] != 429:
            if time.monotonic() > deadline:
                raise Failed("the gateway never throttled the demo tenant at 1 request per second")
        big = {"inputs": [{**i, "shape": [64, 16], "data": list(range(16)) * 64} for i in body["inputs"]]}
        http("POST", f"http://{whttp}/v2/models/simple/infer", json.dumps(big).encode(), hdrs)

        # The images' HEALTHCHECK script against the live roles: control plane, worker, nothing.
        health = INFRA / "docker" / "healthcheck.sh"
        base_env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
        for what, extra, expect in [("control plane", {"TESSERA_LISTEN": api.removeprefix("http://")}, 0),
                                  ("worker", {"TESSERA_HTTP_PORT": whttp.rsplit(":", 1)[1]}, 0),
                                  ("a closed port", {"TESSERA_HEALTHCHECK_URL": "http://127.0.0.1:1/v2/health/live"}, 1)]:
            rc = subprocess.run(["bash", str(health)], env={**base_env, **extra}, capture_output=True).returncode
            if (rc == 0) != (expect == 0):
                raise Failed(f"infra/docker/healthcheck.sh against {what}: exit {rc}")

        # A second worker on the fake NVML: one H200 with seven 1g.18gb instances.
        nvml = fake_nvml(work)
        gpu_env = {"FAKE_NVML_GPUS": "h200:1g.18gb*7"}
        gpu = live.start("gpu-worker", ["worker", "--control-plane", api, f"--worker-token={secrets['worker_token']}",
                                        "--data-dir", str(work / "gpu-worker"), "--nvml-library", str(nvml),
                                        "--cpu-slices", "0", "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
                                        "--metrics-address", "127.0.0.1", "--http-port", "0", "--grpc-port", "0",
                                        "--metrics-port", "0"], gpu_env)
        m = live.wait_log(gpu, r'listening.*protocol="?metrics"?.*addr=([0-9.]+:\d+)', 60)
        gmetrics = f"http://{m.group(1)}/metrics"
        live.wait_log(gpu, r"registered with the control plane", 60)

        # The chart's inventory check against the same fake NVML: the grant agrees, then not.
        check = CHART / "files" / "check-inventory.sh"
        env = {**os.environ, **gpu_env, "TESSERA_BIN": binary, "TESSERA_NVML_LIBRARY": str(nvml)}
        ok = subprocess.run(["bash", str(check), "mig-1g.18gb=7", "--", "true"], env=env, capture_output=True, text=True)
        bad = subprocess.run(["bash", str(check), "mig-1g.18gb=4", "--", "true"], env=env, capture_output=True, text=True)
        if ok.returncode != 0 or bad.returncode == 0 or "granted 4 x mig-1g.18gb, NVML shows 7" not in bad.stderr:
            raise Failed(f"check-inventory.sh: agreeing grant exit {ok.returncode} ({ok.stderr.strip()}); "
                         f"disagreeing grant exit {bad.returncode} ({bad.stderr.strip()})")

        # `tessera serve` over the demo model.
        repo = work / "repository" / "simple" / "1"
        repo.mkdir(parents=True)
        shutil.copy(work / "dev" / "models" / "simple.onnx", repo / "model.onnx")
        serve = live.start("serve", ["serve", "--model-repository", str(work / "repository"), "--http-port", "0",
                                     "--grpc-port", "0", "--metrics-port", "0"])
        m = live.wait_log(serve, r'listening.*protocol="?http"?.*addr=([0-9.]+:\d+)', 60)
        shttp = m.group(1)
        m = live.wait_log(serve, r'listening.*protocol="?metrics"?.*addr=([0-9.]+:\d+)', 60)
        smetrics = f"http://{m.group(1)}/metrics".replace("0.0.0.0", "127.0.0.1")
        deadline = time.monotonic() + 30
        while http("GET", f"http://{shttp}/v2/models/simple/ready".replace("0.0.0.0", "127.0.0.1"))[0] != 200:
            if time.monotonic() > deadline:
                raise Failed("tessera serve: model simple not ready")
            time.sleep(0.2)
        http("POST", f"http://{shttp}/v2/models/simple/infer".replace("0.0.0.0", "127.0.0.1"), json.dumps(body).encode(),
             {"Content-Type": "application/json"})

        endpoints = [("control plane", f"{api}/metrics"), ("worker", wmetrics), ("gpu worker", gmetrics),
                     ("serve", smetrics), ("gateway", gwmetrics)]
        scraped: dict[str, dict[str, set[str]]] = {role: {} for role, _ in endpoints}
        deadline = time.monotonic() + 20
        while True:
            # At least twice: CPU utilization is the change between two scrapes.
            for role, url in endpoints:
                status, text = http("GET", url)
                if status != 200:
                    raise Failed(f"{role} {url}: HTTP {status}")
                parse_exposition(text.decode(), scraped[role])
            seen = set().union(*(names.keys() for names in scraped.values()))
            if (want <= seen and "nv_cpu_utilization" in seen) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        return scraped
    finally:
        live.stop()


# ---------------------------------------------------------------------------------------------
# Stages
# ---------------------------------------------------------------------------------------------


class Run:
    def __init__(self, args):
        self.args, self.failed, self.out = args, [], Path(args.out)
        self.rendered: dict[str, list[tuple[str, dict]]] = {}

    def stage(self, name: str, fn) -> None:
        if self.args.only and name not in self.args.only:
            return
        say(f"== {name}")
        start = time.monotonic()
        try:
            fn()
            say(f"== {name}: ok ({time.monotonic() - start:.1f}s)")
        except Failed as e:
            say(f"== {name}: FAILED ({time.monotonic() - start:.1f}s)\n{e}")
            self.failed.append(name)
        except Exception:  # noqa: BLE001 - a broken check is a failed stage, with its trace
            say(f"== {name}: FAILED ({time.monotonic() - start:.1f}s)\n{traceback.format_exc()}")
            self.failed.append(name)

    def lint(self):
        import helm_python

        problems = []
        for label, values in values_sets().items():
            report = helm_python.lint(str(CHART), values, strict=True, namespace=NAMESPACE)
            for msg in report.get("messages", []):
                # Severity 1 is informational ("icon is recommended").
                if msg["severity"] >= 2:
                    problems.append(f"{label}: {msg['path']}: {msg['error']}")
            problems += [f"{label}: {e}" for e in report.get("errors", [])]
        if problems:
            raise Failed("\n".join(problems))

    def render(self):
        if self.out.exists():
            shutil.rmtree(self.out)
        for label, values in values_sets().items():
            docs = documents(render(values))
            self.rendered[label] = docs
            dest = self.out / label
            dest.mkdir(parents=True)
            for i, (template, doc) in enumerate(docs):
                name = f"{i:02d}-{doc['kind'].lower()}-{doc['metadata']['name']}.yaml"
                (dest / name).write_text(yaml.safe_dump(doc, sort_keys=False))
            kinds = sorted({d["kind"] for _, d in docs})
            say(f"   {label}: {len(docs)} manifests ({', '.join(kinds)}) in {dest}")
        # The KServe manifests beside them, so one checkov run scans everything.
        (self.out / "kserve").mkdir()
        for path in KSERVE.glob("*.yaml"):
            shutil.copy(path, self.out / "kserve" / path.name)
        refused = []
        for what, bad, expect in BAD_VALUES:
            values = merge(DEFAULT_REQUIRED, bad) if what != "no database" else bad
            try:
                render(values)
                refused.append(f"bad values ({what}) rendered instead of failing: {bad}")
            except Exception as e:  # noqa: BLE001 - helm's errors are the point here
                if expect not in str(e):
                    refused.append(f"bad values ({what}) failed without naming {expect!r}: {e}")
        if refused:
            raise Failed("\n".join(refused))
        say(f"   {len(BAD_VALUES)} bad value sets refused at install")

    def kubernetes(self):
        errors = []
        checked = 0
        for label, docs in self.rendered.items():
            for template, doc in docs:
                validate_kubernetes(doc, f"{label}/{template}", errors)
                checked += 1
        for path in sorted(KSERVE.glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    validate_kubernetes(doc, str(path.relative_to(ROOT)), errors)
                    checked += 1
        if errors:
            raise Failed("\n".join(errors))
        say(f"   {checked} manifests valid against Kubernetes {', '.join(KUBE_VERSIONS)} (strict) or their CRD schema")

    def flags(self):
        if not self.args.tessera_bin:
            raise Failed("no tessera binary (--tessera-bin or TESSERA_BIN)")
        errors, notes, cache = [], [], {}
        for label, docs in self.rendered.items():
            for template, doc in docs:
                check_container_flags(self.args.tessera_bin, doc, f"{label}/{template}", cache, errors, notes)
        for path in sorted(KSERVE.glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    check_container_flags(self.args.tessera_bin, doc, str(path.relative_to(ROOT)), cache, errors, notes)
        for note in sorted(set(notes)):
            say(f"   note: {note}")
        if errors:
            raise Failed("\n".join(errors))

    def checkov(self):
        venv_bin = Path(sys.executable).parent
        base = [str(venv_bin / "checkov"), "--skip-download", "--quiet", "--compact", "-o", "cli"]
        problems = []
        run = subprocess.run(base + ["--framework", "kubernetes", "-d", str(self.out)],
                             capture_output=True, text=True)
        if run.returncode != 0:
            problems.append(run.stdout + run.stderr)
        run = subprocess.run(base + ["--framework", "dockerfile", "-f", str(DOCKERFILE)], capture_output=True, text=True)
        if run.returncode != 0:
            problems.append(run.stdout + run.stderr)
        if problems:
            raise Failed("\n".join(problems))

    def hadolint(self):
        venv_bin = Path(sys.executable).parent
        run = subprocess.run([str(venv_bin / "hadolint"), str(DOCKERFILE)], capture_output=True, text=True)
        if run.returncode != 0:
            raise Failed(run.stdout + run.stderr)

    def yamllint(self):
        files = [str(CHART / "Chart.yaml"), str(CHART / "values.yaml"), str(RULES)]
        files += sorted(str(p) for p in (CHART / "ci").glob("*.yaml")) + sorted(str(p) for p in KSERVE.glob("*.yaml"))
        run = subprocess.run([sys.executable, "-m", "yamllint", "--strict", "-c", str(INFRA / ".yamllint"), *files],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise Failed(run.stdout + run.stderr)

    def metrics(self):
        if not self.args.tessera_bin:
            raise Failed("no tessera binary (--tessera-bin or TESSERA_BIN)")
        used, recorded = queried_metrics()
        with tempfile.TemporaryDirectory(prefix="tessera-metrics-") as tmp:
            scraped = scrape_live(self.args.tessera_bin, Path(tmp), set(used) - recorded)
        exported: dict[str, set[str]] = {}
        for names in scraped.values():
            for n, labels in names.items():
                exported.setdefault(n, set()).update(labels)
        problems = []
        for name, labels in sorted(used.items()):
            if name in recorded:
                continue
            if name not in exported:
                problems.append(f"{name}: queried by the dashboard or the rules, exported by no Tessera role")
                continue
            missing = labels - exported[name] - {"__name__"}
            if missing:
                problems.append(f"{name}: matched on label(s) {sorted(missing)} it does not carry "
                                f"(it has {sorted(exported[name])})")
        if problems:
            raise Failed("\n".join(problems))
        say(f"   {len(used) - len(used.keys() & recorded)} metric names queried, all exported "
            f"({', '.join(f'{role}: {len(n)}' for role, n in scraped.items())} names scraped)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "tessera-infra-rendered"),
                        help="where the rendered manifests go (replaced)")
    parser.add_argument("--only", type=lambda s: set(s.split(",")), default=None, help="comma-separated stages")
    parser.add_argument("--tessera-bin", default=os.environ.get("TESSERA_BIN"))
    args = parser.parse_args()
    run = Run(args)
    start = time.monotonic()
    if args.only and "render" not in args.only and args.only & {"kubernetes", "flags", "checkov"}:
        run.render()  # they read what render wrote
    for name in ["lint", "render", "kubernetes", "flags", "checkov", "hadolint", "yamllint", "metrics"]:
        run.stage(name, getattr(run, name))
    took = time.monotonic() - start
    if run.failed:
        say(f"FAILED: {', '.join(run.failed)} ({took:.1f}s)")
        return 1
    say(f"all infra checks passed ({took:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
