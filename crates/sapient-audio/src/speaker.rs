//! Live audio output through cpal (feature `mic`): mono `f32` samples pushed at the
//! device's rate are played on every channel; when the queue runs dry the device plays
//! silence. The cpal stream lives on its own thread, as the microphone's does.

use crate::error::{check_rate, Error, Result};
use crate::mic::find_device;
use cpal::traits::{DeviceTrait, StreamTrait};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// The default (or a named) output device, playing until dropped.
pub struct SpeakerOutput {
    queue: Arc<Mutex<VecDeque<f32>>>,
    rate: u32,
    name: String,
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for SpeakerOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpeakerOutput").field("device", &self.name).field("rate", &self.rate).finish()
    }
}

/// Fills `out` (interleaved, `ch` channels) from the queue, silence when it is empty.
fn fill<T: Copy>(out: &mut [T], ch: usize, queue: &Mutex<VecDeque<f32>>, conv: impl Fn(f32) -> T) {
    let mut q = queue.lock().unwrap_or_else(|p| p.into_inner());
    for frame in out.chunks_mut(ch) {
        let v = conv(q.pop_front().unwrap_or(0.0).clamp(-1.0, 1.0));
        frame.iter_mut().for_each(|s| *s = v);
    }
}

impl SpeakerOutput {
    /// The output device whose name contains `name` (the default device when `None`), at
    /// its default configuration (f32 or 16-bit samples).
    pub fn open(name: Option<&str>) -> Result<Self> {
        let wanted = name.map(str::to_string);
        let queue = Arc::new(Mutex::new(VecDeque::new()));
        let q = queue.clone();
        let (setup_tx, setup_rx) = std::sync::mpsc::channel::<Result<(u32, String)>>();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("sapient-speaker".into())
            .spawn(move || {
                let setup = || -> Result<(cpal::Stream, u32, String)> {
                    let device = find_device(wanted.as_deref(), true)?;
                    let dev_name = device.name().unwrap_or_else(|_| "<unnamed>".into());
                    let supported = device.default_output_config().map_err(|e| Error::Device(e.to_string()))?;
                    let rate = check_rate(supported.sample_rate().0)?;
                    let ch = supported.channels().max(1) as usize;
                    let config = supported.config();
                    let err = |e: cpal::StreamError| tracing::warn!("audio output: {e}");
                    let stream = match supported.sample_format() {
                        cpal::SampleFormat::F32 => device.build_output_stream(&config, move |out: &mut [f32], _: &cpal::OutputCallbackInfo| fill(out, ch, &q, |x| x), err, None),
                        cpal::SampleFormat::I16 => {
                            device.build_output_stream(&config, move |out: &mut [i16], _: &cpal::OutputCallbackInfo| fill(out, ch, &q, |x| (x * 32767.0) as i16), err, None)
                        }
                        f => return Err(Error::Device(format!("output sample format {f:?} (f32 or i16 supported)"))),
                    }
                    .map_err(|e| Error::Device(e.to_string()))?;
                    stream.play().map_err(|e| Error::Device(e.to_string()))?;
                    Ok((stream, rate, dev_name))
                };
                match setup() {
                    Ok((stream, rate, name)) => {
                        let _ = setup_tx.send(Ok((rate, name)));
                        let _ = stop_rx.recv();
                        drop(stream);
                    }
                    Err(e) => {
                        let _ = setup_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| Error::Device(format!("spawning the playback thread: {e}")))?;
        let (rate, name) = setup_rx.recv().map_err(|_| Error::Device("the playback thread ended during setup".into()))??;
        tracing::info!(device = %name, rate, "speaker open");
        Ok(Self { queue, rate, name, stop: Some(stop_tx), thread: Some(thread) })
    }

    pub fn device_name(&self) -> &str {
        &self.name
    }

    /// The device's rate: [`push`](Self::push) samples at this rate.
    pub fn sample_rate(&self) -> u32 {
        self.rate
    }

    /// Queue mono samples for playback.
    pub fn push(&self, samples: &[f32]) {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).extend(samples.iter().copied());
    }

    /// Samples queued and not yet played.
    pub fn queued(&self) -> usize {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Drop what is queued (the rest of an interrupted reply).
    pub fn clear(&self) {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

impl Drop for SpeakerOutput {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
