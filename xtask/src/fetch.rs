//! `cargo xtask fetch [PRESET|GROUP ...]`: fetch into the cache with progress bars and
//! sha256 checks. Default: the `ci` group. `--list` shows presets, groups and cache state.

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use sapient_hub::{Hub, Progress};
use std::collections::HashMap;

#[derive(clap::Args)]
pub struct Args {
    /// Preset ids or group names (see models/registry.toml). Default: the `ci` group.
    pub names: Vec<String>,
    /// List presets and groups, and whether each preset is cached.
    #[arg(long)]
    pub list: bool,
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
    for id in ids {
        let mut bars: HashMap<String, ProgressBar> = HashMap::new();
        let style = ProgressStyle::with_template("{msg:48!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}")?.progress_chars("=> ");
        let r = hub.fetch_preset(&id, &mut |p| match p {
            Progress::Downloading { source, file, done, total } => {
                let b = bars.entry(file.clone()).or_insert_with(|| {
                    let b = ProgressBar::new(total.unwrap_or(0));
                    b.set_style(style.clone());
                    b
                });
                b.set_message(format!("{id}/{file} <- {source}"));
                if let Some(t) = total {
                    b.set_length(t);
                }
                b.set_position(done);
            }
            Progress::Done { file } => {
                if let Some(b) = bars.remove(&file) {
                    b.finish_and_clear();
                }
            }
            _ => {}
        })?;
        for (_, b) in bars.drain() {
            b.finish_and_clear();
        }
        println!("{id}: {}", r.dir.display());
        for (role, files) in &r.files {
            for f in files {
                let size = std::fs::metadata(f).map(|m| m.len()).unwrap_or(0);
                println!("  {role:16} {:>10.1} MB  {}", size as f64 / 1e6, f.file_name().map(|n| n.to_string_lossy()).unwrap_or_default());
            }
        }
    }
    Ok(())
}
