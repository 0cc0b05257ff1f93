//! The loop over a recording, without devices: the input is pushed frame by frame and the
//! output pulled in step with it (the output sample at time t answers the input at time t),
//! as if the models took no time. What the loop decides (turns, barge-in, what is heard)
//! is then what it would decide live; the latency a live loop adds is measured separately
//! (the events' [`crate::ReplyTimings`] and `cargo xtask bench voice`).

use crate::{Event, Result, VoiceLoop};

/// A recording run through the loop.
#[derive(Debug, Clone, Default)]
pub struct FileRun {
    /// The loop's audio out at its output rate, from the start of the input; after the
    /// input ends it goes on until the last reply is spoken.
    pub output: Vec<f32>,
    pub output_rate: u32,
    /// Every event, with the input time (ms) at which it happened.
    pub events: Vec<(u64, Event)>,
}

/// Runs `input` (at the loop's input rate) through `lp` in frames of `frame_ms`; after its
/// end, waits at most `tail_s` seconds of output for the last reply to be spoken.
/// Whisper on a pause runs in the push that saw it (the input comes faster than real time).
pub fn run(lp: &mut VoiceLoop, input: &[f32], frame_ms: u32, tail_s: f64) -> Result<FileRun> {
    lp.set_pauses_in_background(false);
    let r = run_waiting(lp, input, frame_ms, tail_s);
    lp.set_pauses_in_background(true);
    r
}

fn run_waiting(lp: &mut VoiceLoop, input: &[f32], frame_ms: u32, tail_s: f64) -> Result<FileRun> {
    let frame_ms = frame_ms.clamp(1, 1000);
    let in_rate = lp.options().input_rate as usize;
    let out_rate = lp.output_rate();
    let fin = (in_rate * frame_ms as usize / 1000).max(1);
    let fout = (out_rate as usize * frame_ms as usize / 1000).max(1);
    let mut run = FileRun { output_rate: out_rate, ..FileRun::default() };
    let mut t = 0u64;
    for frame in input.chunks(fin) {
        lp.push_audio(frame)?;
        run.output.extend(lp.pull_audio(fout, true));
        run.events.extend(lp.drain_events().into_iter().map(|e| (t, e)));
        t += frame_ms as u64;
    }
    lp.finish_input()?;
    let tail_frames = (tail_s * 1000.0 / frame_ms as f64).ceil() as usize;
    for _ in 0..tail_frames {
        run.events.extend(lp.drain_events().into_iter().map(|e| (t, e)));
        if !lp.replying() {
            break;
        }
        run.output.extend(lp.pull_audio(fout, true));
        t += frame_ms as u64;
    }
    run.events.extend(lp.drain_events().into_iter().map(|e| (t, e)));
    Ok(run)
}
