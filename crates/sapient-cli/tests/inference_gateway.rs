//! The Gateway API inference extension objects (deploy/k8s/inference-gateway) against the
//! base deployment and the real server: the InferencePool selects the sapient pods on the port
//! they serve, its endpoint picker is the EPP Service on the EPP's gRPC port, the HTTPRoute
//! sends a Gateway's requests to the pool, the EPP's plugin configuration is where it reads it,
//! and every metric name the EPP is given is one `sapient serve` exports as a gauge, readable
//! without the API key with the flag the overlay adds. No cluster is needed.
//!
//! Each object of the overlay with a CRD is validated against that CRD's `openAPIV3Schema`:
//! the InferencePool, Gateway and HTTPRoute schemas kept in `tests/data/gateway-crds` (see its
//! README), and with `SAPIENT_GATEWAY_CRDS=DIR` also the CRDs in that folder (another
//! release's `config/crd/bases`, say).

#[path = "../../sapient-server/tests/common/mod.rs"]
mod common;
mod process;

use anyhow::{bail, ensure, Context, Result};
use common::get;
use process::{listening, sapient, spawn, wait_ready};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every document of every YAML file in `dir` (relative to the repository), as JSON.
fn documents(dir: &str) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f)?;
        for d in serde_yaml::Deserializer::from_str(&text) {
            let v: Value = serde::Deserialize::deserialize(d).with_context(|| f.display().to_string())?;
            if !v.is_null() {
                out.push(v);
            }
        }
    }
    Ok(out)
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Result<&'a Value> {
    docs.iter().find(|d| d["kind"] == kind && d["metadata"]["name"] == name).with_context(|| format!("{kind} {name}"))
}

fn str_at<'a>(v: &'a Value, path: &str) -> Result<&'a str> {
    v.pointer(path).and_then(Value::as_str).with_context(|| format!("{path} in {}", v["metadata"]["name"]))
}

/// The value of `--name=value` (or `--name value`) in a container's args.
fn arg<'a>(args: &'a [Value], name: &str) -> Option<&'a str> {
    let args: Vec<&str> = args.iter().filter_map(Value::as_str).collect();
    args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix(name).and_then(|rest| match rest.strip_prefix('=') {
            Some(v) => Some(v),
            None if rest.is_empty() => args.get(i + 1).copied(),
            None => None,
        })
    })
}

/// The container port of `container` that `port` (a number or a port name) means.
fn container_port(container: &Value, port: &Value) -> Result<u64> {
    let ports = container["ports"].as_array().context("ports")?;
    match port {
        Value::Number(n) => n.as_u64().filter(|n| ports.iter().any(|p| p["containerPort"] == *n)).context("a declared port"),
        Value::String(s) => ports.iter().find(|p| p["name"] == *s).and_then(|p| p["containerPort"].as_u64()).with_context(|| format!("port {s}")),
        _ => bail!("a port is a number or a name: {port}"),
    }
}

/// The checks that need no server; returns the EPP's metric names and the base Deployment's
/// serving arguments with the overlay's patch applied.
fn objects_fit_together() -> Result<(Vec<String>, Vec<String>)> {
    let base = documents("deploy/k8s")?;
    let overlay = documents("deploy/k8s/inference-gateway")?;
    let kustomization = overlay.iter().find(|d| d["kind"] == "Kustomization").context("the overlay's kustomization")?;
    let resources: Vec<&str> = kustomization["resources"].as_array().context("resources")?.iter().filter_map(Value::as_str).collect();
    ensure!(resources.contains(&"../"), "the overlay builds on deploy/k8s");
    for r in resources.iter().filter(|r| r.ends_with(".yaml")) {
        ensure!(root().join("deploy/k8s/inference-gateway").join(r).is_file(), "{r} exists");
    }

    // The pool: the sapient pods, on the port they serve.
    let server = find(&base, "Deployment", "sapient")?;
    let pod_labels = server["spec"]["template"]["metadata"]["labels"].as_object().context("pod labels")?;
    let container = &server["spec"]["template"]["spec"]["containers"][0];
    let args = container["args"].as_array().context("args")?;
    let served: u64 = arg(args, "--port").context("--port")?.parse()?;
    let pool = find(&overlay, "InferencePool", "sapient")?;
    ensure!(pool["apiVersion"] == "inference.networking.k8s.io/v1", "InferencePool v1: {}", pool["apiVersion"]);
    let selector = pool["spec"]["selector"]["matchLabels"].as_object().context("matchLabels")?;
    ensure!(!selector.is_empty() && selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)), "the pool selects the sapient pods: {selector:?} vs {pod_labels:?}");
    let ports = pool["spec"]["targetPorts"].as_array().context("targetPorts")?;
    ensure!(ports.len() == 1 && ports[0]["number"] == served, "the pool's port is the one served ({served}): {ports:?}");
    container_port(container, &Value::from(served))?;

    // Its endpoint picker: the EPP Service, on the EPP container's gRPC port.
    let picker = &pool["spec"]["endpointPickerRef"];
    let service = find(&overlay, "Service", str_at(picker, "/name")?)?;
    let sport = service["spec"]["ports"].as_array().and_then(|p| p.iter().find(|p| p["port"] == picker["port"]["number"])).context("the Service port the pool names")?;
    let epp = find(&overlay, "Deployment", "sapient-epp")?;
    let epp_labels = epp["spec"]["template"]["metadata"]["labels"].as_object().context("EPP pod labels")?;
    let ssel = service["spec"]["selector"].as_object().context("Service selector")?;
    ensure!(ssel.iter().all(|(k, v)| epp_labels.get(k) == Some(v)), "the EPP Service selects the EPP pods");
    let econt = &epp["spec"]["template"]["spec"]["containers"][0];
    let grpc = container_port(econt, &sport["targetPort"])?;
    ensure!(econt["ports"].as_array().is_some_and(|p| p.iter().any(|p| p["name"] == "grpc" && p["containerPort"] == grpc)), "the Service reaches the EPP's gRPC port");
    ensure!(sport["appProtocol"] == "http2", "the gateway speaks gRPC (HTTP/2) to the EPP");

    // The EPP watches this pool and reads its configuration where the ConfigMap is mounted.
    let eargs = econt["args"].as_array().context("EPP args")?;
    ensure!(arg(eargs, "--pool-name") == Some("sapient"), "--pool-name");
    ensure!(arg(eargs, "--pool-group") == Some("inference.networking.k8s.io"), "--pool-group is the pool's API group");
    let config = arg(eargs, "--config-file").context("--config-file")?;
    let (dir, file) = config.rsplit_once('/').context("a path")?;
    let mount = econt["volumeMounts"].as_array().and_then(|m| m.iter().find(|m| m["mountPath"] == dir)).context("the config folder is mounted")?;
    let volume = epp["spec"]["template"]["spec"]["volumes"].as_array().and_then(|v| v.iter().find(|v| v["name"] == mount["name"])).context("its volume")?;
    let cm = find(&overlay, "ConfigMap", str_at(volume, "/configMap/name")?)?;
    let text = cm["data"][file].as_str().with_context(|| format!("{file} in the EPP ConfigMap"))?;
    let cfg: Value = serde_yaml::from_str(text)?;
    ensure!(cfg["kind"] == "EndpointPickerConfig");
    let declared: Vec<&Value> = cfg["plugins"].as_array().context("plugins")?.iter().map(|p| &p["type"]).collect();
    for profile in cfg["schedulingProfiles"].as_array().context("profiles")? {
        for p in profile["plugins"].as_array().context("profile plugins")? {
            ensure!(declared.contains(&&p["pluginRef"]), "{} is declared", p["pluginRef"]);
        }
    }
    let role = find(&overlay, "Role", "sapient-epp")?;
    let binding = find(&overlay, "RoleBinding", "sapient-epp")?;
    ensure!(binding["roleRef"]["name"] == role["metadata"]["name"] && binding["subjects"][0]["name"] == epp["spec"]["template"]["spec"]["serviceAccountName"], "the EPP's account has the Role");
    let can = |group: &str, resource: &str| {
        role["rules"].as_array().is_some_and(|r| r.iter().any(|r| r["apiGroups"].as_array().is_some_and(|g| g.iter().any(|g| g == group)) && r["resources"].as_array().is_some_and(|x| x.iter().any(|x| x == resource))))
    };
    ensure!(can("", "pods") && can("inference.networking.k8s.io", "inferencepools"), "the EPP may watch pods and pools");

    // The route: a Gateway's requests to the pool.
    let route = find(&overlay, "HTTPRoute", "sapient")?;
    let backend = &route["spec"]["rules"][0]["backendRefs"][0];
    ensure!(backend["group"] == "inference.networking.k8s.io" && backend["kind"] == "InferencePool" && backend["name"] == pool["metadata"]["name"], "{backend}");
    find(&overlay, "Gateway", str_at(&route["spec"]["parentRefs"][0], "/name")?)?;

    let metrics: Vec<String> = ["--total-queued-requests-metric", "--total-running-requests-metric", "--kv-cache-usage-percentage-metric"]
        .iter()
        .map(|f| arg(eargs, f).map(String::from).with_context(|| format!("{f}: the default names vLLM's metrics")))
        .collect::<Result<_>>()?;
    // The overlay's patch: what it appends to the server's arguments.
    let patch: Value = serde_yaml::from_str(kustomization["patches"][0]["patch"].as_str().context("the patch")?)?;
    ensure!(patch[0]["op"] == "add" && patch[0]["path"] == "/spec/template/spec/containers/0/args/-", "{patch}");
    let mut patched: Vec<String> = args.iter().filter_map(|a| a.as_str().map(String::from)).collect();
    patched.push(str_at(&patch[0], "/value")?.to_string());
    Ok((metrics, patched))
}

/// Validate the overlay's objects against the CRDs in `dir` (each CRD's served version).
fn validate_against_crds(dir: &Path) -> Result<usize> {
    let overlay = documents("deploy/k8s/inference-gateway")?;
    let mut checked = 0;
    for f in std::fs::read_dir(dir)?.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|e| e == "yaml")) {
        let text = std::fs::read_to_string(&f)?;
        for d in serde_yaml::Deserializer::from_str(&text) {
            let crd: Value = serde::Deserialize::deserialize(d)?;
            if crd["kind"] != "CustomResourceDefinition" {
                continue;
            }
            let group = crd["spec"]["group"].as_str().unwrap_or_default();
            let kind = &crd["spec"]["names"]["kind"];
            for version in crd["spec"]["versions"].as_array().into_iter().flatten() {
                let api = format!("{group}/{}", version["name"].as_str().unwrap_or_default());
                let schema = &version["schema"]["openAPIV3Schema"];
                for obj in overlay.iter().filter(|o| o["kind"] == *kind && o["apiVersion"] == api.as_str()) {
                    match sapient_sample::validate(schema, obj) {
                        Ok(Ok(())) => checked += 1,
                        Ok(Err(e)) => bail!("{kind} {} does not fit {api} ({}): {e}", obj["metadata"]["name"], f.display()),
                        Err(e) => bail!("the schema of {api} ({}): {e}", f.display()),
                    }
                }
            }
        }
    }
    Ok(checked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inference_gateway_objects_fit_the_deployment_and_the_server() -> Result<()> {
    let (metrics, args) = objects_fit_together()?;
    let kept = root().join("crates/sapient-cli/tests/data/gateway-crds");
    let n = validate_against_crds(&kept)?;
    // the InferencePool, the Gateway and the HTTPRoute
    ensure!(n == 3, "{n} objects of the overlay checked against the CRDs in {}, expected 3", kept.display());
    if let Some(dir) = std::env::var_os("SAPIENT_GATEWAY_CRDS") {
        let n = validate_against_crds(Path::new(&dir))?;
        ensure!(n > 0, "no object of the overlay has a CRD in {}", Path::new(&dir).display());
        eprintln!("{n} objects valid against the CRDs in {}", Path::new(&dir).display());
    }
    tokio::time::timeout(Duration::from_secs(300), async {
        // The server as the patched Deployment runs it, with one model and a key.
        let mut run = args.clone();
        for (flag, value) in [("--port", "0"), ("--host", "127.0.0.1")] {
            match run.iter().position(|a| a == flag) {
                Some(i) => run[i + 1] = value.into(),
                None => run.extend([flag.to_string(), value.to_string()]),
            }
        }
        if let Some(i) = run.iter().position(|a| a == "--config") {
            run.drain(i..i + 2);
        }
        run.extend(["--model".to_string(), "smollm2-135m-instruct".to_string()]);
        let mut cmd = sapient();
        cmd.args(&run).env("SAPIENT_API_KEY", "gateway-test-key");
        let (p, rx) = spawn(cmd)?;
        let addr = listening(&rx, Duration::from_secs(60), |_| Ok(()))?;
        wait_ready(addr, "/health").await?;
        ensure!(get(addr, "/v1/models").await?.status == 401, "the API stays behind the key");
        let r = get(addr, "/metrics").await?;
        ensure!(r.status == 200, "/metrics without the key (--public-metrics): {} {}", r.status, r.text());
        let text = r.text();
        for m in &metrics {
            ensure!(text.lines().any(|l| l == format!("# TYPE {m} gauge")), "the EPP reads {m}, which the server does not export as a gauge");
            ensure!(text.lines().any(|l| l.starts_with(&format!("{m}{{model_name=\"smollm2-135m-instruct\"}} "))), "{m} has the model's row");
        }
        drop(p);
        Ok(())
    })
    .await?
}

/// The validation can fail: the overlay's InferencePool without its selector, or with its
/// port as a string, does not fit the kept schema.
#[test]
fn a_broken_pool_does_not_fit_its_crd() -> Result<()> {
    let text = std::fs::read_to_string(root().join("crates/sapient-cli/tests/data/gateway-crds/inference.networking.k8s.io_inferencepools.yaml"))?;
    let crd: Value = serde_yaml::from_str(&text)?;
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let overlay = documents("deploy/k8s/inference-gateway")?;
    let pool = overlay.iter().find(|o| o["kind"] == "InferencePool").context("the overlay has no InferencePool")?;
    ensure!(matches!(sapient_sample::validate(schema, pool), Ok(Ok(()))), "the pool as written fits");
    let mut no_selector = pool.clone();
    no_selector["spec"].as_object_mut().context("spec")?.remove("selector");
    ensure!(matches!(sapient_sample::validate(schema, &no_selector), Ok(Err(_))), "a pool without a selector must not fit");
    let mut bad_port = pool.clone();
    bad_port["spec"]["targetPorts"] = serde_json::json!([{"number": "8080"}]);
    ensure!(matches!(sapient_sample::validate(schema, &bad_port), Ok(Err(_))), "a string port must not fit");
    Ok(())
}
