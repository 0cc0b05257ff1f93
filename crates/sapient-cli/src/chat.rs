//! `sapient chat`: an interactive conversation that samples with the model's recommended
//! settings and stops an answer that loops.

use crate::{messages_with_system, print_stats, stream_to_stdout, GenOpts};
use anyhow::Result;
use sapient_generate::{FinishReason, Message, SamplerConfig};
use sapient_sample::{RepetitionDetector, RepetitionOptions};
use std::io::{BufRead, Write};
use std::ops::ControlFlow;
use std::path::Path;

/// The model's own sampling settings (`generation_config.json` next to its weights) or
/// llama.cpp's defaults, and where they come from.
fn recommended(model_path: &Path) -> (SamplerConfig, String) {
    let dir = if model_path.is_dir() {
        Some(model_path)
    } else {
        model_path.parent()
    };
    if let Some(file) = dir
        .map(|d| d.join("generation_config.json"))
        .filter(|f| f.is_file())
    {
        let parsed = std::fs::read_to_string(&file)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).map_err(|e| e.to_string()));
        match parsed {
            Ok(json) => {
                if let Some(cfg) = SamplerConfig::from_generation_config(&json) {
                    return (cfg, format!("the model's {}", file.display()));
                }
            }
            Err(e) => tracing::warn!("ignoring {}: {e}", file.display()),
        }
    }
    (
        SamplerConfig::chat_defaults(None),
        "llama.cpp's defaults".into(),
    )
}

/// A seed for this session, printed so that a conversation can be replayed with `--seed`.
fn fresh_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    (t as u64 ^ ((std::process::id() as u64) << 32)) % 1_000_000_007
}

pub(crate) fn run(opts: &GenOpts, allow_loops: bool) -> Result<()> {
    let pipe = opts.load()?;
    let mut cfg = opts.generation_config()?;
    let (base, source) = recommended(&pipe.info().path);
    cfg.sampling = opts.sampling(base);
    if !cfg.sampling.is_greedy() && cfg.sampling.seed.is_none() {
        cfg.sampling.seed = Some(fresh_seed());
    }
    cfg.sampling.validate()?;
    let given = [
        opts.temperature.is_some(),
        opts.top_k.is_some(),
        opts.top_p.is_some(),
        opts.min_p.is_some(),
        opts.repeat_penalty.is_some(),
    ];
    let from = if given.iter().any(|&g| g) {
        format!("{source} with your options")
    } else {
        source
    };
    eprintln!(
        "sampling: {} ({from}; --temperature 0 for greedy)",
        cfg.sampling
    );
    let mut history = messages_with_system(&opts.system);
    let stdin = std::io::stdin();
    let interactive = std::io::IsTerminal::is_terminal(&stdin);
    if interactive {
        eprintln!(
            "chatting with {} ({}); /reset clears the history, /exit quits",
            pipe.info().id,
            pipe.info().architecture
        );
    }
    let mut detector = RepetitionDetector::new(RepetitionOptions::words());
    loop {
        if interactive {
            eprint!("> ");
            std::io::stderr().flush().ok();
        }
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim();
        match line {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                history = messages_with_system(&opts.system);
                pipe.reset_cache();
                eprintln!("(history cleared)");
                continue;
            }
            _ => {}
        }
        history.push(Message::user(line));
        detector.reset();
        // The answer as streamed, split into words for the detector (with the byte offset
        // where each starts), and where it stops being worth keeping when it loops.
        let mut answer = String::new();
        let mut word_starts: Vec<usize> = Vec::new();
        let mut word = String::new();
        let mut keep = None;
        let g = pipe.chat_with(&history, &cfg, |piece| {
            let flow = stream_to_stdout(piece);
            for c in piece.chars() {
                answer.push(c);
                if !c.is_whitespace() {
                    if word.is_empty() {
                        word_starts.push(answer.len() - c.len_utf8());
                    }
                    word.push(c);
                    continue;
                }
                if word.is_empty() {
                    continue;
                }
                if let (false, Some(r)) = (allow_loops, detector.push(std::mem::take(&mut word))) {
                    // The history keeps what was said before the loop took over.
                    keep = Some(word_starts.get(r.since).copied().unwrap_or(answer.len()));
                    return ControlFlow::Break(());
                }
            }
            flow
        })?;
        println!();
        if opts.stats {
            print_stats(&g);
        }
        let text = match keep {
            Some(end) => {
                eprintln!("(stopped: the answer kept repeating itself; --allow-loops lets it run on)");
                answer[..end].trim_end().to_string()
            }
            None => g.text,
        };
        if g.finish == FinishReason::ContextFull {
            eprintln!("(the context is full: /reset to start over)");
        }
        history.push(Message::assistant(text));
    }
    Ok(())
}
