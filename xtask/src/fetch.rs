//! `cargo xtask fetch [PRESET|GROUP ...]`: fetch into the cache with progress bars and
//! sha256 checks. Default: the `ci` group. `--list` shows presets, groups and cache state;
//! `--verify` re-hashes files already in the cache.

use anyhow::{Context, Result};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use sapient_hub::{Hub, Progress, ResolvedModel};
use std::collections::HashMap;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// Preset ids or group names (see crates/sapient-hub/registry.toml). Default: the `ci` group.
    pub names: Vec<String>,
    /// List presets and groups, and whether each preset is cached.
    #[arg(long)]
    pub list: bool,
    /// Also re-hash (sha256) files that are already in the cache; a bad one is removed and
    /// fetched again.
    #[arg(long)]
    pub verify: bool,
}

pub fn run(args: Args) -> Result<()> {
    let hub = Hub::new()?;
    if args.list {
        println!("{:30} {:10} {:>10} {:7} groups", "preset", "kind", "size", "cached");
        for p in hub.registry().presets() {
            println!(
                "{:30} {:10} {:>8.1}MB {:7} {}",
                p.id,
                p.kind,
                p.total_size() as f64 / 1e6,
                if hub.cached(&p.id)? { "yes" } else { "no" },
                p.groups.join(",")
            );
        }
        println!("\ngroups: {} (and `all`)\ncache: {}", hub.registry().groups().join(", "), hub.cache_dir().display());
        return Ok(());
    }
    let names = if args.names.is_empty() { vec!["ci".to_string()] } else { args.names };
    let ids = hub.registry().expand(&names)?;
    let multi = MultiProgress::new();
    let bytes_style = ProgressStyle::with_template("{msg:56!} [{bar:30}] {bytes:>10}/{total_bytes:10} {bytes_per_sec:>12} {eta:>4}")?
        .progress_chars("=> ");
    let spin_style = ProgressStyle::with_template("{msg:56!} {spinner} {elapsed}")?;
    let mut done: Vec<ResolvedModel> = Vec::new();
    for id in &ids {
        let mut bars: HashMap<String, ProgressBar> = HashMap::new();
        let mut on_progress = |p: Progress| match p {
            Progress::Downloading { source, file, done, total } => {
                let b = bars.entry(file.clone()).or_insert_with(|| multi.add(ProgressBar::new(0)));
                match total {
                    // A package download: the registry client reports no bytes.
                    None => {
                        b.set_style(spin_style.clone());
                        b.enable_steady_tick(Duration::from_millis(120));
                        b.set_message(format!("{id}/{file} <- {source} (downloading)"));
                    }
                    Some(t) => {
                        b.disable_steady_tick();
                        b.set_style(bytes_style.clone());
                        b.set_message(format!("{id}/{file} <- {source}"));
                        b.set_length(t);
                        b.set_position(done);
                    }
                }
            }
            Progress::Verifying { file } => {
                let b = bars.entry(file.clone()).or_insert_with(|| multi.add(ProgressBar::new(0)));
                b.set_style(spin_style.clone());
                b.enable_steady_tick(Duration::from_millis(120));
                b.set_message(format!("{id}/{file} (sha256)"));
            }
            Progress::Done { file } => {
                if let Some(b) = bars.remove(&file) {
                    b.finish_and_clear();
                }
            }
            _ => {}
        };
        let r = if args.verify && hub.cached(id)? {
            match hub.verify(id, &mut on_progress) {
                Ok(r) => r,
                Err(e) => {
                    multi.println(format!("{id}: {e}; fetching again"))?;
                    hub.fetch_preset(id, &mut on_progress)?
                }
            }
        } else {
            hub.fetch_preset(id, &mut on_progress).with_context(|| format!("fetching {id}"))?
        };
        for (_, b) in bars.drain() {
            b.finish_and_clear();
        }
        done.push(r);
    }
    println!("cache: {}", hub.cache_dir().display());
    for r in &done {
        let total: u64 = r.files.values().flatten().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
        println!("{} ({:.1} MB{}): {}", r.id, total as f64 / 1e6, if args.verify { ", sha256 verified" } else { "" }, r.dir.display());
        for (role, files) in &r.files {
            for f in files {
                let size = std::fs::metadata(f).map(|m| m.len()).unwrap_or(0);
                println!(
                    "  {role:16} {:>10.1} MB  {}",
                    size as f64 / 1e6,
                    f.file_name().map(|n| n.to_string_lossy()).unwrap_or_default()
                );
            }
        }
    }
    Ok(())
}
