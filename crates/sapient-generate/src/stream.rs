use crate::generation::Generation;
use crate::{Error, Result};
use futures::Stream;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::{mpsc, oneshot};

/// A stream of text chunks from a generation running on its own thread. Dropping it stops
/// the generation at the next token.
pub struct TextStream {
    rx: mpsc::UnboundedReceiver<String>,
    done: Option<oneshot::Receiver<Result<Generation>>>,
    result: Option<Result<Generation>>,
}

impl TextStream {
    pub(crate) fn spawn<F>(work: F) -> Self
    where
        F: FnOnce(&mut dyn FnMut(&str) -> ControlFlow<()>) -> Result<Generation> + Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel::<String>();
        let (done_tx, done_rx) = oneshot::channel();
        std::thread::spawn(move || {
            let mut on_text = |piece: &str| {
                if tx.is_closed() {
                    return ControlFlow::Break(());
                }
                if !piece.is_empty() && tx.send(piece.to_string()).is_err() {
                    return ControlFlow::Break(());
                }
                ControlFlow::Continue(())
            };
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&mut on_text)))
                .unwrap_or_else(|_| Err(Error::Worker("generation panicked".into())));
            let _ = done_tx.send(r);
        });
        Self { rx, done: Some(done_rx), result: None }
    }

    /// Wait for the end and return the whole generation (text and stats); chunks not yet
    /// read are included in its text.
    pub async fn finish(mut self) -> Result<Generation> {
        while self.rx.recv().await.is_some() {}
        self.take_result().await
    }

    /// The same as [`Self::finish`] for callers outside an async runtime.
    pub fn finish_blocking(mut self) -> Result<Generation> {
        while self.rx.blocking_recv().is_some() {}
        match self.result.take() {
            Some(r) => r,
            None => match self.done.take() {
                Some(d) => d.blocking_recv().map_err(|_| Error::Worker("worker vanished".into()))?,
                None => Err(Error::Worker("result already taken".into())),
            },
        }
    }

    /// The next chunk for callers outside an async runtime.
    pub fn blocking_next(&mut self) -> Option<String> {
        self.rx.blocking_recv()
    }

    async fn take_result(&mut self) -> Result<Generation> {
        if let Some(r) = self.result.take() {
            return r;
        }
        match self.done.take() {
            Some(d) => d.await.map_err(|_| Error::Worker("worker vanished".into()))?,
            None => Err(Error::Worker("result already taken".into())),
        }
    }
}

impl Stream for TextStream {
    type Item = String;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<String>> {
        self.rx.poll_recv(cx)
    }
}
