//! Streams and the VAD chunker: same segments as offline, from memory, files, iterators,
//! async streams, at 16 kHz and through a 48 kHz source.

mod common;

use candle_core::Device;
use common::*;
use futures::StreamExt;
use sapient_audio::{
    resample, voiced_segments, AudioStream, BlockingStream, FileStream, IterStream, SamplesStream, SileroVad, VadOptions,
    VadSegmenter, VoicedChunker, VoicedSegment,
};

fn vad() -> SileroVad {
    SileroVad::load(silero("onnx"), &Device::Cpu).unwrap()
}

/// Offline reference: probabilities of the whole 16 kHz signal, segments, and their samples.
fn offline(x16: &[f32], opts: &VadOptions) -> Vec<VoicedSegment> {
    let p = vad().probabilities(x16).unwrap();
    VadSegmenter::new(opts.clone())
        .unwrap()
        .segments(&p, x16.len())
        .into_iter()
        .map(|s| VoicedSegment { start_s: s.start_s, end_s: s.end_s, samples: x16[s.start..s.end].to_vec() })
        .collect()
}

fn check_same(got: &[VoicedSegment], want: &[VoicedSegment], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: segment count");
    for (g, w) in got.iter().zip(want) {
        assert_eq!((g.start_s, g.end_s), (w.start_s, w.end_s), "{what}");
        assert_eq!(g.samples.len(), w.samples.len(), "{what}");
        assert!(max_abs_diff(&g.samples, &w.samples) < 1e-6, "{what}: samples differ");
    }
}

#[test]
fn chunker_equals_offline_segmentation() {
    let x = concat_audio();
    for opts in [VadOptions::default(), VadOptions { speech_pad_ms: 200, ..Default::default() }, VadOptions { max_speech_s: 1.5, ..Default::default() }] {
        let want = offline(&x, &opts);
        assert!(want.len() >= 4, "the joined clips have several segments");
        for (seed, max) in [(1u64, 700usize), (2, 9000)] {
            let mut chunker = VoicedChunker::new(vad(), opts.clone(), 16_000).unwrap();
            let mut got = Vec::new();
            let mut at = 0;
            for n in chunk_lengths(x.len(), max, seed) {
                let segs = chunker.push(&x[at..at + n]).unwrap();
                at += n;
                // A segment is handed out only once its end has been heard.
                for s in &segs {
                    assert!(s.end_s * 16_000.0 <= at as f64 + 1.0);
                }
                got.extend(segs);
            }
            got.extend(chunker.finish().unwrap());
            check_same(&got, &want, &format!("{opts:?} chunks<={max}"));
        }
    }
}

#[test]
fn chunker_over_a_48k_stream_resamples() {
    let x = concat_audio();
    let x48 = resample(&x, 16_000, 48_000).unwrap();
    // The chunker's streaming resampler equals the one-shot one, so the reference is the
    // offline pipeline on the one-shot round trip.
    let back = resample(&x48, 48_000, 16_000).unwrap();
    let want = offline(&back, &VadOptions::default());
    let chunker = VoicedChunker::new(vad(), VadOptions::default(), 48_000).unwrap();
    let src = SamplesStream::new(x48, 48_000, 4800).unwrap();
    let got: Vec<_> = chunker.segments(src).unwrap().collect::<Result<_, _>>().unwrap();
    check_same(&got, &want, "48 kHz source");
    // A chunker made for one rate refuses a stream at another.
    let chunker = VoicedChunker::new(vad(), VadOptions::default(), 48_000).unwrap();
    assert!(chunker.segments(SamplesStream::new(vec![0.0; 10], 16_000, 5).unwrap()).is_err());
}

#[test]
fn file_iterator_and_async_sources() {
    let path = clip("0890");
    let x = clip_samples("0890");
    let want = offline(&x, &VadOptions::default());
    assert!(!want.is_empty());

    let file = FileStream::open(&path).unwrap();
    assert_eq!(file.sample_rate(), 16_000);
    let got: Vec<_> = VoicedChunker::new(vad(), VadOptions::default(), 16_000).unwrap().segments(file).unwrap().collect::<Result<_, _>>().unwrap();
    check_same(&got, &want, "file");

    let chunks: Vec<Vec<f32>> = x.chunks(1234).map(|c| c.to_vec()).collect();
    let it = IterStream::new(chunks.clone().into_iter(), 16_000).unwrap();
    let got: Vec<_> = VoicedChunker::new(vad(), VadOptions::default(), 16_000).unwrap().segments(it).unwrap().collect::<Result<_, _>>().unwrap();
    check_same(&got, &want, "iterator");

    let bs = BlockingStream::new(futures::stream::iter(chunks.clone().into_iter().map(Ok)), 16_000).unwrap();
    let got: Vec<_> = VoicedChunker::new(vad(), VadOptions::default(), 16_000).unwrap().segments(bs).unwrap().collect::<Result<_, _>>().unwrap();
    check_same(&got, &want, "blocking futures stream");

    let s = voiced_segments(futures::stream::iter(chunks.into_iter().map(Ok)), 16_000, vad(), VadOptions::default()).unwrap();
    let got: Vec<_> = futures::executor::block_on(s.collect::<Vec<_>>()).into_iter().collect::<Result<_, _>>().unwrap();
    check_same(&got, &want, "async");

    // An error from the source ends the stream with that error.
    let bad = futures::stream::iter(vec![Ok(x[..8000].to_vec()), Err(sapient_audio::Error::Device("unplugged".into()))]);
    let s = voiced_segments(bad, 16_000, vad(), VadOptions::default()).unwrap();
    let items = futures::executor::block_on(s.collect::<Vec<_>>());
    assert!(matches!(items.last(), Some(Err(sapient_audio::Error::Device(_)))));
}

#[test]
fn silence_and_noise_streams_have_no_voice() {
    let mut sig = vec![0.0f32; 5 * 16_000];
    sig.extend(noise(5 * 16_000, 0.05, 77));
    let src = SamplesStream::new(sig, 16_000, 2048).unwrap();
    let segs: Vec<_> = VoicedChunker::new(vad(), VadOptions::default(), 16_000).unwrap().segments(src).unwrap().collect::<Result<_, _>>().unwrap();
    assert!(segs.is_empty(), "{} segments", segs.len());
}

#[test]
fn resampled_stream_equals_one_shot() {
    let x = clip_samples("0880");
    let want = resample(&x, 16_000, 44_100).unwrap();
    let mut s = SamplesStream::new(x, 16_000, 777).unwrap().resampled(44_100).unwrap();
    assert_eq!(s.sample_rate(), 44_100);
    let got = s.collect_samples().unwrap();
    assert!(max_abs_diff(&got, &want) < 1e-6);
    assert!(SamplesStream::new(vec![], 16_000, 0).is_err());
    assert!(IterStream::new(std::iter::empty::<Vec<f32>>(), 5).is_err());
}

#[test]
fn pipeline_types_can_move_to_worker_threads() {
    fn send<T: Send>() {}
    send::<sapient_audio::Decoder>();
    send::<FileStream>();
    send::<SileroVad>();
    send::<VoicedChunker>();
    send::<sapient_audio::LogMel>();
    send::<sapient_audio::MelStream>();
    send::<sapient_audio::Resampler>();
    // Run one on another thread for real.
    let x = clip_samples("0880");
    let h = std::thread::spawn(move || {
        let mut c = VoicedChunker::new(vad(), VadOptions::default(), 16_000).unwrap();
        let mut n = c.push(&x).unwrap().len();
        n += c.finish().unwrap().len();
        n
    });
    assert_eq!(h.join().unwrap(), 1);
}
