#!/usr/bin/env python3
"""Checks the Kubernetes example in deploy/k8s without a cluster (needs PyYAML).

Every file parses; the Kustomization lists files that exist; the Deployment's selector
matches its pod labels and the Service's selector; the Service's target port, the probes'
ports and the container port are the same named port; every probe asks /health; every volume
mount names a volume; the ConfigMap the pod mounts and the Secret its API key comes from are
the ones defined (the Secret is created by hand, as the Kustomization says); the pod runs as
the Dockerfile's non-root user. Exits non-zero naming the first problem.

    python3 scripts/check-deploy.py
"""
import pathlib
import re
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"


def fail(msg):
    sys.exit(f"check-deploy: {msg}")


def main():
    docs = {}
    for f in sorted(K8S.glob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            if d is None:
                continue
            for key in ("apiVersion", "kind"):
                if key not in d:
                    fail(f"{f.name}: no {key}")
            docs.setdefault(d["kind"], []).append((f.name, d))
    kust = docs["Kustomization"][0][1]
    for r in kust["resources"]:
        if not (K8S / r).is_file():
            fail(f"kustomization.yaml lists {r}, which does not exist")
    listed = {n for kind, ds in docs.items() if kind != "Kustomization" for n, _ in ds}
    if listed != set(kust["resources"]):
        fail(f"kustomization.yaml resources {sorted(kust['resources'])} != files {sorted(listed)}")

    (_, dep), = docs["Deployment"]
    (_, svc), = docs["Service"]
    (_, cm), = docs["ConfigMap"]
    pod = dep["spec"]["template"]
    labels = pod["metadata"]["labels"]
    for what, sel in (("Deployment", dep["spec"]["selector"]["matchLabels"]), ("Service", svc["spec"]["selector"])):
        if not sel or any(labels.get(k) != v for k, v in sel.items()):
            fail(f"the {what} selector {sel} does not match the pod labels {labels}")
    (c,), = [pod["spec"]["containers"]]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    args = c["args"]
    port = int(args[args.index("--port") + 1])
    if list(ports.values()) != [port]:
        fail(f"container ports {ports} != --port {port}")
    for p in svc["spec"]["ports"]:
        if p["targetPort"] not in ports and p["targetPort"] != port:
            fail(f"the Service targets port {p['targetPort']}, not a container port")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        g = c[probe]["httpGet"]
        if g["path"] != "/health" or (g["port"] not in ports and g["port"] != port):
            fail(f"{probe} asks {g}, not /health on the served port")
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    for m in c["volumeMounts"]:
        if m["name"] not in volumes:
            fail(f"volume mount {m['name']} has no volume")
    mounts = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"]}
    config = pathlib.PurePosixPath(args[args.index("--config") + 1])
    v = mounts.get(str(config.parent))
    if not v or v.get("configMap", {}).get("name") != cm["metadata"]["name"] or config.name not in cm["data"]:
        fail(f"--config {config} is not the ConfigMap's {list(cm['data'])}")
    env = {e["name"]: e for e in c["env"]}
    if "secretKeyRef" not in env.get("SAPIENT_API_KEY", {}).get("valueFrom", {}):
        fail("SAPIENT_API_KEY does not come from a Secret")
    home = env["SAPIENT_HOME"]["value"]
    if home not in mounts:
        fail(f"SAPIENT_HOME {home} is not a volume")
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    user = re.findall(r"^USER\s+(\d+)", dockerfile, re.M)
    ctx = pod["spec"]["securityContext"]
    if not user or str(ctx.get("runAsUser")) != user[-1].split(":")[0] or not ctx.get("runAsNonRoot"):
        fail(f"the pod's user {ctx} is not the Dockerfile's USER {user}")
    if f"SAPIENT_HOME={home}" not in dockerfile:
        fail(f"the Dockerfile's SAPIENT_HOME is not {home}")
    print(f"check-deploy: {len(listed)} manifests consistent (port {port}, probes on /health, config {config}, cache {home})")


if __name__ == "__main__":
    main()
