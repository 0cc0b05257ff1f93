//! `GET /metrics`: Prometheus text. The engine's gauges (waiting and running requests, KV
//! cache utilisation, the names the Kubernetes Gateway API inference extension is pointed at)
//! and counters, plus the server's latency histograms.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A fixed-bucket histogram of seconds (lock-free).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    /// Sum in microseconds.
    sum_us: AtomicU64,
    count: AtomicU64,
}

const LATENCY: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Self { bounds, counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(), sum_us: AtomicU64::new(0), count: AtomicU64::new(0) }
    }
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|&b| s <= b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.sum_us.fetch_add(d.as_micros() as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }
    fn write(&self, out: &mut String, name: &str, labels: &str) {
        let mut cum = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cum += c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {cum}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum_us.load(Ordering::Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
    }
}

/// A histogram family: its help and type once, then each labelled histogram.
pub(crate) fn histograms(out: &mut String, name: &str, help: &str, rows: &[(&str, &Histogram)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (labels, h) in rows {
        h.write(out, name, labels);
    }
}

/// The server's own measurements, per language model.
#[derive(Debug)]
pub struct LlmStats {
    pub ttft: Histogram,
    pub inter_token: Histogram,
    pub e2e: Histogram,
    pub requests_ok: AtomicU64,
    pub requests_cancelled: AtomicU64,
    pub requests_failed: AtomicU64,
}

impl Default for LlmStats {
    fn default() -> Self {
        Self {
            ttft: Histogram::new(LATENCY),
            inter_token: Histogram::new(LATENCY),
            e2e: Histogram::new(LATENCY),
            requests_ok: AtomicU64::new(0),
            requests_cancelled: AtomicU64::new(0),
            requests_failed: AtomicU64::new(0),
        }
    }
}

/// Speech synthesis: sentences synthesized, and streams whose client left before the end.
#[derive(Debug, Default)]
pub struct SpeechStats {
    pub sentences: AtomicU64,
    pub streams_cancelled: AtomicU64,
}

/// Counters of HTTP answers by status class.
#[derive(Debug, Default)]
pub struct HttpStats {
    pub by_status: std::sync::Mutex<std::collections::BTreeMap<u16, u64>>,
}

impl HttpStats {
    pub fn record(&self, status: u16) {
        if let Ok(mut m) = self.by_status.lock() {
            *m.entry(status).or_default() += 1;
        }
    }
}

pub(crate) fn gauge(out: &mut String, name: &str, help: &str, kind: &str, rows: &[(String, f64)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, v) in rows {
        let _ = writeln!(out, "{name}{{{labels}}} {v}");
    }
}

/// Render everything.
pub(crate) fn render(state: &crate::AppState) -> String {
    let mut out = String::new();
    let models = state.models.get();
    let label = model_label;
    // Engine figures of the models loaded now; the server's own for every model loaded once.
    let mut engines: Vec<(String, sapient_generate::EngineMetrics)> = Vec::new();
    if let Some(m) = models {
        m.llms.for_each_loaded(|e, l| engines.push((label(&e.id), l.engine.metrics())));
    }
    let llms: Vec<(String, &LlmStats)> =
        models.map(|m| m.llms.entries.iter().filter(|e| e.ever_loaded()).map(|e| (label(&e.id), &*e.stats)).collect()).unwrap_or_default();
    type Get = fn(&sapient_generate::EngineMetrics) -> f64;
    let engine_rows: &[(&str, &str, &str, Get)] = &[
        ("sapient:num_requests_waiting", "Requests waiting for a sequence slot (queued or preempted).", "gauge", |m| m.waiting as f64),
        ("sapient:num_requests_running", "Requests being decoded.", "gauge", |m| m.running as f64),
        ("sapient:kv_cache_usage_perc", "Share of KV cache blocks held by running sequences (0 to 1).", "gauge", |m| m.kv.utilisation()),
        ("sapient:kv_cache_blocks_used", "KV cache blocks held by sequences.", "gauge", |m| m.kv.used_blocks as f64),
        ("sapient:kv_cache_blocks_cached", "KV cache blocks held only by the prefix cache.", "gauge", |m| m.kv.cached_blocks as f64),
        ("sapient:kv_cache_blocks_total", "KV cache blocks in all.", "gauge", |m| m.kv.total_blocks as f64),
        ("sapient:prompt_tokens_total", "Prompt tokens admitted.", "counter", |m| m.prompt_tokens as f64),
        ("sapient:prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache.", "counter", |m| m.cached_prompt_tokens as f64),
        ("sapient:generation_tokens_total", "Tokens generated.", "counter", |m| m.generated_tokens as f64),
        ("sapient:engine_steps_total", "Batched forward passes.", "counter", |m| m.steps as f64),
        ("sapient:num_preemptions_total", "Sequences preempted for KV cache room.", "counter", |m| m.preemptions as f64),
        ("sapient:requests_finished_total", "Requests the engine finished.", "counter", |m| m.finished as f64),
        ("sapient:requests_cancelled_total", "Requests cancelled (client gone).", "counter", |m| m.cancelled as f64),
    ];
    for (name, help, kind, get) in engine_rows {
        let rows: Vec<(String, f64)> = engines.iter().map(|(l, m)| (l.clone(), get(m))).collect();
        gauge(&mut out, name, help, kind, &rows);
    }
    type Pick = fn(&LlmStats) -> &Histogram;
    let families: [(&str, &str, Pick); 3] = [
        ("sapient:time_to_first_token_seconds", "Time from request to first token.", |s| &s.ttft),
        ("sapient:inter_token_latency_seconds", "Time between streamed pieces of text.", |s| &s.inter_token),
        ("sapient:e2e_request_latency_seconds", "Time from request to last token.", |s| &s.e2e),
    ];
    for (name, help, pick) in families {
        let rows: Vec<(&str, &Histogram)> = llms.iter().map(|(l, s)| (l.as_str(), pick(s))).collect();
        histograms(&mut out, name, help, &rows);
    }
    let outcome: Vec<(String, f64)> = llms
        .iter()
        .flat_map(|(l, s)| {
            [
                (format!("{l},outcome=\"ok\""), s.requests_ok.load(Ordering::Relaxed) as f64),
                (format!("{l},outcome=\"cancelled\""), s.requests_cancelled.load(Ordering::Relaxed) as f64),
                (format!("{l},outcome=\"error\""), s.requests_failed.load(Ordering::Relaxed) as f64),
            ]
        })
        .collect();
    gauge(&mut out, "sapient:generation_requests_total", "Generation requests answered, by outcome.", "counter", &outcome);
    let http: Vec<(String, f64)> = state
        .http
        .by_status
        .lock()
        .map(|m| m.iter().map(|(s, n)| (format!("code=\"{s}\""), *n as f64)).collect())
        .unwrap_or_default();
    gauge(&mut out, "sapient:http_responses_total", "HTTP responses by status code.", "counter", &http);
    let speech = &state.speech;
    gauge(&mut out, "sapient:speech_sentences_total", "Sentences (text chunks) synthesized to speech.", "counter", &[(String::new(), speech.sentences.load(Ordering::Relaxed) as f64)]);
    gauge(&mut out, "sapient:speech_streams_cancelled_total", "Streamed speech stopped because the client left.", "counter", &[(String::new(), speech.streams_cancelled.load(Ordering::Relaxed) as f64)]);
    gauge(&mut out, "sapient:ready", "1 once the models are loaded.", "gauge", &[(String::new(), if models.is_some() { 1.0 } else { 0.0 })]);
    out
}

/// The label of a model's rows.
pub(crate) fn model_label(id: &str) -> String {
    format!("model_name=\"{}\"", escape(id))
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
