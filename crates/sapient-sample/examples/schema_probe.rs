use sapient_sample::{Grammar, Matcher, TokenIndex};
use std::sync::Arc;
use std::time::Instant;
fn main() {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string("/work/probe/vocab.json").unwrap()).unwrap();
    let toks: Vec<Vec<u8>> = v["tokens"].as_array().unwrap().iter().map(|h| {
        let h = h.as_str().unwrap();
        (0..h.len() / 2).map(|i| u8::from_str_radix(&h[2 * i..2 * i + 2], 16).unwrap()).collect()
    }).collect();
    let special: Vec<u32> = v["special"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let index = Arc::new(TokenIndex::new(toks, &[151643], &special));
    for f in std::env::args().skip(1) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(std::fs::read_to_string(&f).unwrap().trim_start_matches('\u{feff}')) else { continue };
        let list: Vec<serde_json::Value> = match &v { serde_json::Value::Array(a) => a.iter().map(|g| g["schema"].clone()).collect(), _ => vec![v.clone()] };
        for s in list {
        let t0 = Instant::now();
        let g = match Grammar::json_schema(&s) { Ok(g) => Arc::new(g), Err(e) => { println!("{f}: refused {e}"); continue } };
        let c = t0.elapsed();
        let t1 = Instant::now();
        let p = g.prepare(&index);
        let _ = t1;
        let t2 = Instant::now();
        let mut m = Matcher::new(g.clone(), index.clone());
        let tn = t2.elapsed();
        let mk = m.mask().unwrap();
        eprintln!("NEW {:.3} MASK {:.3}", tn.as_secs_f64()*1e3, (t2.elapsed()-tn).as_secs_f64()*1e3);
        let fm = t2.elapsed();
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut worst = (0.0f64, 0usize);
        let mut mask = mk.clone();
        for i in 0..(if std::env::var_os("SKIPWALK").is_some() { 0 } else { 32 }) {
            let ids: Vec<u32> = mask.iter().filter(|&t| t != 151643).collect();
            if ids.is_empty() { break }
            rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
            m.consume(ids[(rng % ids.len() as u64) as usize]).unwrap();
            let t = Instant::now();
            mask = std::sync::Arc::new(m.compute_mask_uncached().unwrap());
            let e = t.elapsed().as_secs_f64() * 1e3;
            if e > worst.0 { worst = (e, i) }
        }
        println!("  worst mask {:.2} ms at step {}", worst.0, worst.1);
        println!("{} {}: nodes {} dfa_states {} compile {:.1} ms prepare {:.1} ms first mask {:.1} ms (allowed {})", f.rsplit('/').next().unwrap(), serde_json::to_string(&s).unwrap().chars().take(120).collect::<String>(), g.num_nodes(), g.num_dfa_states(), c.as_secs_f64()*1e3, p.as_secs_f64()*1e3, fm.as_secs_f64()*1e3, mk.count());
    }
}
}
