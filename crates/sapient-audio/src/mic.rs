//! Live microphone input through cpal (feature `mic`).
//!
//! The cpal stream lives on its own thread (cpal streams are not `Send` everywhere); its
//! callback mixes each buffer down to mono `f32` and sends it over a channel, which
//! [`MicInput`] reads as an [`AudioStream`] (blocking) and [`MicStream`] as a
//! `futures::Stream`.

use crate::error::{check_rate, Error, Result};
use crate::stream::AudioStream;
use cpal::traits::{DeviceTrait, HostTrait, StreamTrait};
use futures::channel::mpsc;
use futures::{Stream, StreamExt};
use std::pin::Pin;
use std::task::{Context, Poll};

/// The default (or a named) input device, capturing until dropped.
pub struct MicInput {
    rx: mpsc::UnboundedReceiver<Result<Vec<f32>>>,
    rate: u32,
    channels: u16,
    name: String,
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for MicInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MicInput").field("device", &self.name).field("rate", &self.rate).finish()
    }
}

fn mono<T: Copy>(data: &[T], channels: usize, conv: impl Fn(T) -> f32) -> Vec<f32> {
    let inv = 1.0 / channels as f32;
    data.chunks_exact(channels).map(|f| f.iter().map(|&s| conv(s)).sum::<f32>() * inv).collect()
}

/// The host's default input (or output) device, or the first whose name contains `wanted`.
pub(crate) fn find_device(wanted: Option<&str>, output: bool) -> Result<cpal::Device> {
    let host = cpal::default_host();
    let kind = if output { "output" } else { "input" };
    match wanted {
        None => if output { host.default_output_device() } else { host.default_input_device() }.ok_or_else(|| Error::Device(format!("no default {kind} device"))),
        Some(w) => {
            let mut devices = if output { host.output_devices() } else { host.input_devices() }.map_err(|e| Error::Device(e.to_string()))?;
            devices.find(|d| d.name().map(|n| n.contains(w)).unwrap_or(false)).ok_or_else(|| Error::Device(format!("no {kind} device named like '{w}'")))
        }
    }
}

impl MicInput {
    /// The host's default input device at its default configuration.
    pub fn open_default() -> Result<Self> {
        Self::open(None)
    }

    /// The input device whose name contains `name` (default device when `None`).
    pub fn open(name: Option<&str>) -> Result<Self> {
        let wanted = name.map(str::to_string);
        let (tx, rx) = mpsc::unbounded();
        let (setup_tx, setup_rx) = std::sync::mpsc::channel::<Result<(u32, u16, String)>>();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("sapient-mic".into())
            .spawn(move || {
                let setup = || -> Result<(cpal::Stream, u32, u16, String)> {
                    let device = find_device(wanted.as_deref(), false)?;
                    let dev_name = device.name().unwrap_or_else(|_| "<unnamed>".into());
                    let supported = device.default_input_config().map_err(|e| Error::Device(e.to_string()))?;
                    let rate = check_rate(supported.sample_rate().0)?;
                    let channels = supported.channels();
                    let ch = channels.max(1) as usize;
                    let format = supported.sample_format();
                    let config = supported.config();
                    let data_tx = tx.clone();
                    let err_tx = tx.clone();
                    let stream = device
                        .build_input_stream_raw(
                            &config,
                            format,
                            move |data: &cpal::Data, _: &cpal::InputCallbackInfo| {
                                let chunk = if let Some(s) = data.as_slice::<f32>() {
                                    mono(s, ch, |x| x)
                                } else if let Some(s) = data.as_slice::<i16>() {
                                    mono(s, ch, |x| x as f32 / 32768.0)
                                } else if let Some(s) = data.as_slice::<u16>() {
                                    mono(s, ch, |x| (x as f32 - 32768.0) / 32768.0)
                                } else if let Some(s) = data.as_slice::<i32>() {
                                    mono(s, ch, |x| (x as f64 / 2_147_483_648.0) as f32)
                                } else if let Some(s) = data.as_slice::<u8>() {
                                    mono(s, ch, |x| (x as f32 - 128.0) / 128.0)
                                } else if let Some(s) = data.as_slice::<i8>() {
                                    mono(s, ch, |x| x as f32 / 128.0)
                                } else {
                                    let _ = data_tx.unbounded_send(Err(Error::Device(format!(
                                        "unsupported sample format {:?}",
                                        data.sample_format()
                                    ))));
                                    return;
                                };
                                let _ = data_tx.unbounded_send(Ok(chunk));
                            },
                            move |e| {
                                let _ = err_tx.unbounded_send(Err(Error::Device(e.to_string())));
                            },
                            None,
                        )
                        .map_err(|e| Error::Device(e.to_string()))?;
                    stream.play().map_err(|e| Error::Device(e.to_string()))?;
                    Ok((stream, rate, channels, dev_name))
                };
                match setup() {
                    Ok((stream, rate, channels, name)) => {
                        let _ = setup_tx.send(Ok((rate, channels, name)));
                        let _ = stop_rx.recv();
                        drop(stream);
                    }
                    Err(e) => {
                        let _ = setup_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| Error::Device(format!("spawning the capture thread: {e}")))?;
        let (rate, channels, name) =
            setup_rx.recv().map_err(|_| Error::Device("the capture thread ended during setup".into()))??;
        tracing::info!(device = %name, rate, channels, "microphone open");
        Ok(Self { rx, rate, channels, name, stop: Some(stop_tx), thread: Some(thread) })
    }

    pub fn device_name(&self) -> &str {
        &self.name
    }

    /// Channels captured (chunks are mixed down to mono).
    pub fn channels(&self) -> u16 {
        self.channels
    }

    /// The same capture as an async `Stream` of chunks.
    pub fn into_stream(self) -> MicStream {
        MicStream { mic: self }
    }

    fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MicInput {
    fn drop(&mut self) {
        self.stop();
    }
}

impl AudioStream for MicInput {
    fn sample_rate(&self) -> u32 {
        self.rate
    }
    fn next_chunk(&mut self) -> Option<Result<Vec<f32>>> {
        futures::executor::block_on(self.rx.next())
    }
}

/// [`MicInput`] as a `futures::Stream` of mono chunks.
pub struct MicStream {
    mic: MicInput,
}

impl MicStream {
    pub fn sample_rate(&self) -> u32 {
        self.mic.rate
    }
}

impl Stream for MicStream {
    type Item = Result<Vec<f32>>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.mic.rx.poll_next_unpin(cx)
    }
}
