//! Audio decoding through symphonia (WAV, FLAC, MP3, Ogg/Vorbis): decode the whole input,
//! with a duration limit so that a small compressed file cannot expand without bound.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = sapient_audio::Decoder::from_bytes(data.to_vec()) {
        let _ = d.with_max_duration(600.0).decode_all();
    }
});
