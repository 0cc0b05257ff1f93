use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {
    /// Preset ids or group names (see models/registry.toml).
    pub names: Vec<String>,
}

pub fn run(_args: Args) -> Result<()> {
    anyhow::bail!("not implemented yet")
}
