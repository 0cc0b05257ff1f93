//! Word timestamps of a window's segments (openai-whisper's `add_word_timestamps`).

use super::*;

impl Transcriber {
    /// openai-whisper's `add_word_timestamps` for the segments of one window.
    pub(super) fn add_word_timestamps(
        &self,
        segs: &mut [Segment],
        cross: &crate::model::CrossKv,
        base: &DecodeOptions,
        time_offset: f64,
        num_frames: usize,
        last_speech_timestamp: &mut f64,
    ) -> Result<()> {
        let tok = &self.tokenizer;
        let per_segment: Vec<Vec<u32>> = segs.iter().map(|s| s.tokens.iter().copied().filter(|&t| t < tok.eot).collect()).collect();
        let text_tokens: Vec<u32> = per_segment.iter().flatten().copied().collect();
        let plain = DecodeOptions { prompt: Vec::new(), without_timestamps: false, ..base.clone() };
        let (sot_sequence, _) = crate::decode::initial_tokens(&self.model, tok, &plain)?;
        let mut alignment = timing::find_alignment(&self.model, tok, cross, &sot_sequence, &text_tokens, num_frames)?;
        let (median, max_duration) = timing::truncate_long_words(&mut alignment);
        timing::merge_punctuations(&mut alignment);
        let r2 = |x: f64| (x * 100.0).round() / 100.0;
        let mut wi = 0;
        for (seg, toks) in segs.iter_mut().zip(&per_segment) {
            let mut saved = 0;
            let mut words: Vec<Word> = Vec::new();
            while wi < alignment.len() && saved < toks.len() {
                let w = &alignment[wi];
                if !w.word.is_empty() {
                    words.push(Word { start: r2(time_offset + w.start), end: r2(time_offset + w.end), ..w.clone() });
                }
                saved += w.tokens.len();
                wi += 1;
            }
            if !words.is_empty() {
                // the first and second word after a pause are not longer than twice the median
                let first_long = words[0].end - words[0].start > max_duration;
                let second_long = words.len() > 1 && words[1].end - words[0].start > max_duration * 2.0;
                if words[0].end - *last_speech_timestamp > median * 4.0 && (first_long || second_long) {
                    if words.len() > 1 && words[1].end - words[1].start > max_duration {
                        let boundary = (words[1].end / 2.0).max(words[1].end - max_duration);
                        words[0].end = boundary;
                        words[1].start = boundary;
                    }
                    words[0].start = (words[0].end - max_duration).max(0.0);
                }
                // the segment's own start / end when the first / last word is too long
                if seg.start < words[0].end && seg.start - 0.5 > words[0].start {
                    words[0].start = (words[0].end - median).min(seg.start).max(0.0);
                } else {
                    seg.start = words[0].start;
                }
                let last = words.len() - 1;
                if seg.end > words[last].start && seg.end + 0.5 < words[last].end {
                    words[last].end = (words[last].start + median).max(seg.end);
                } else {
                    seg.end = words[last].end;
                }
                *last_speech_timestamp = seg.end;
            }
            seg.words = words;
        }
        Ok(())
    }
}
