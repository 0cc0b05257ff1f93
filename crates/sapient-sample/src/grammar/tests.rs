use super::*;

fn g(e: Expr) -> Grammar {
    Grammar::new(&e).unwrap()
}
fn ok(g: &Grammar, s: &str) -> bool {
    g.matches(s.as_bytes()).unwrap()
}
/// Is `s` a prefix of something the grammar accepts?
fn prefix(g: &Grammar, s: &str) -> bool {
    g.advance_bytes(&g.start(), s.as_bytes()).unwrap().is_some()
}

#[test]
fn literal_choice_and_ambiguity() {
    let c = g(Expr::one_of(["a", "ab", "abc", "b"]));
    for (s, want) in [("a", true), ("ab", true), ("abc", true), ("b", true), ("", false), ("ac", false), ("abcd", false)] {
        assert_eq!(ok(&c, s), want, "{s:?}");
    }
    // "a" is both complete and a prefix of longer alternatives.
    let st = c.advance_bytes(&c.start(), b"a").unwrap().unwrap();
    assert!(c.is_accepting(&st) && st.num_stacks() == 3);
}

#[test]
fn sequence_repeat_separator() {
    let item = Expr::regex("[a-z]+");
    let list = Expr::literal("[").then(item.separated_by(Expr::literal(", "), 1, Some(3))).then(Expr::literal("]"));
    let c = g(list);
    assert!(ok(&c, "[a]") && ok(&c, "[ab, c]") && ok(&c, "[a, b, c]"));
    assert!(!ok(&c, "[]") && !ok(&c, "[a, b, c, d]") && !ok(&c, "[a,b]") && !ok(&c, "[a, ]"));
    // repeat without separator, min 2
    let c = g(Expr::literal("ab").repeat(2, None));
    assert!(!ok(&c, "ab") && ok(&c, "abab") && ok(&c, "ababab") && !ok(&c, "aba"));
    // optional
    let c = g(Expr::literal("x").then(Expr::literal("y").optional()).then(Expr::literal("z")));
    assert!(ok(&c, "xz") && ok(&c, "xyz") && !ok(&c, "xyyz"));
}

#[test]
fn regex_followed_by_overlapping_literal() {
    // The lexeme may stop at any accepting point: "a*" then "a" needs both parses.
    let c = g(Expr::regex("a*").then(Expr::literal("ab")));
    assert!(ok(&c, "ab") && ok(&c, "aaab") && !ok(&c, "aaa") && !ok(&c, "b"));
}

#[test]
fn integer_ranges() {
    let c = g(Expr::integer(Some(-20), Some(150)));
    for v in -25..160i64 {
        assert_eq!(ok(&c, &v.to_string()), (-20..=150).contains(&v), "{v}");
    }
    assert!(ok(&c, "-0"), "-0 is 0");
    for bad in ["007", "01", "", "-", "1.0", "+1"] {
        assert!(!ok(&c, bad), "{bad:?}");
    }
    // Prefixes that cannot reach the range are rejected at once.
    assert!(!prefix(&c, "160") && !prefix(&c, "-21") && prefix(&c, "15") && prefix(&c, "-2"));
    let c = g(Expr::integer(Some(1000), None));
    assert!(prefix(&c, "9") && !ok(&c, "999") && ok(&c, "1000") && !prefix(&c, "0") && !prefix(&c, "-"));
    let c = g(Expr::integer(None, None));
    assert!(ok(&c, &i64::MIN.to_string()) && ok(&c, &i64::MAX.to_string()));
    assert!(!ok(&c, "9223372036854775808"));
    assert!(matches!(Grammar::new(&Expr::integer(Some(5), Some(4))), Err(GrammarError::Unsatisfiable(_))));
}

#[test]
fn float_ranges() {
    // Numbers as JSON writes them, compared exactly in decimal (crate::number has more).
    let c = g(Expr::float(Some(-1.5), Some(2.25)));
    for (s, want) in [
        ("0", true), ("2.25", true), ("2.26", false), ("2.250", true), ("-1.5", true), ("-1.51", false),
        ("1.", false), ("3", false), ("-0.5", true), ("00.1", false), ("2.2", true), (".5", false),
        ("-0", true), ("-0.0", true), ("1.0", true), ("0.000001", true), ("0.0000001", true), ("225e-2", false), ("2.25e0", true), ("2.3e0", false),
    ] {
        assert_eq!(ok(&c, s), want, "{s:?}");
    }
    // 3e-1 is in range, 3e+1 is not.
    assert!(prefix(&c, "3e-") && !prefix(&c, "3e+") && !prefix(&c, "2.3e0") && prefix(&c, "2.2") && prefix(&c, "2.25000"));
    // exclusive bounds through the builder
    let mut b = Builder::new(JsonOptions::default());
    let n = b.num(0.0, 1.0, true, true).unwrap();
    let c = Grammar::from_parts(b.nodes, b.dfas, n).unwrap();
    assert!(!ok(&c, "0") && !ok(&c, "1") && ok(&c, "0.5") && !ok(&c, "1.0") && ok(&c, "0.99999999") && ok(&c, "1e-99") && !ok(&c, "1e-300"));
    let mut b = Builder::new(JsonOptions::default());
    assert!(b.num(1.0, 0.5, false, false).is_err(), "empty range");
    // No dead end: a prefix is only allowed if some number in range follows.
    let mut b = Builder::new(JsonOptions::default());
    let n = b.num(0.0, 0.0, false, false).unwrap();
    let c = Grammar::from_parts(b.nodes, b.dfas, n).unwrap();
    assert!(ok(&c, "0") && ok(&c, "0.0") && ok(&c, "-0") && !prefix(&c, "0.01") && !prefix(&c, "1"));
}

#[test]
fn stop_at_string() {
    let c = g(Expr::stop_at("</end>"));
    assert!(ok(&c, "</end>") && ok(&c, "abc </en</end>") && !ok(&c, "abc") && !ok(&c, "</end> x"));
    // After the stop string nothing more is accepted.
    let st = c.advance_bytes(&c.start(), b"x</end>").unwrap().unwrap();
    let mut out = GrammarState::default();
    assert!(!c.advance(&st, b'x', &mut out).unwrap());
}

#[test]
fn free_json() {
    let c = g(Expr::Json);
    let flex = Grammar::with_options(&Expr::Json, JsonOptions::flexible(24)).unwrap();
    let spaced = Grammar::with_options(&Expr::Json, JsonOptions::spaced()).unwrap();
    for s in ["1", "-0.5", "\"a\\n\\u00e9\"", "true", "null", "[]", "{}", "[1,[2,{\"a\":null}]]", "\"é日本\"", "\"\\uD83D\\uDE00\""] {
        assert!(ok(&c, s) && ok(&flex, s), "{s}");
    }
    // Whitespace only in the flexible layout; one space after , and : in the spaced one.
    for s in ["[1, [2, {\"a\": null}]]", "{\"a\": {\"b\": [true, false]}, \"c\": \"d\"}"] {
        assert!(!ok(&c, s) && ok(&flex, s) && ok(&spaced, s), "{s}");
    }
    for s in ["{ \"k\" : 1 }", "[\n1]"] {
        assert!(!ok(&c, s) && ok(&flex, s) && !ok(&spaced, s), "{s}");
    }
    for s in ["", "01", "[1,]", "{\"a\"}", "{a: 1}", "\"\\x\"", "[1 2]", "tru", "{\"a\":1,}", "\"\n\"", "\"\\uD800\"", "\"\\uDE00\"", "1.", "-"] {
        assert!(!ok(&c, s) && !ok(&flex, s), "{s}");
    }
    // Numbers in every form JSON has, whatever the layout.
    for (s, want) in [("0.5", true), ("0.1234567", true), ("2.50", true), ("-0", true), ("-0.0", true), ("1e3", true), ("1E-7", true), ("10", true), ("+1", false), ("1e", false)] {
        assert_eq!(ok(&c, s), want, "{s}");
    }
    // Check against serde_json on generated random-ish documents.
    let docs = [
        serde_json::json!({"a": [1, 2.5, -3], "b": {"c": "x\"y", "d": null}, "e": []}),
        serde_json::json!([{"k": true}, "s", 0, {"nested": {"deeper": [[], {}]}}]),
    ];
    for d in docs {
        assert!(ok(&c, &serde_json::to_string(&d).unwrap()));
        assert!(ok(&flex, &serde_json::to_string_pretty(&d).unwrap()));
        assert!(!ok(&c, &serde_json::to_string_pretty(&d).unwrap()));
    }
}

#[test]
fn tool_calls_or_text() {
    let tools = vec![
        Tool::new("get_weather", serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})),
        Tool::new("add", serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]})),
    ];
    let c = g(Expr::text_or_tool_calls("<tool_call>", "</tool_call>", tools));
    let call = "<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}\n</tool_call>";
    let weather = "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>";
    for s in ["", "Hello! 2 < 3, <tool and </tool_call> are text.", call, &format!("Let me add them.\n{call}"), &format!("{call}\n{weather}")] {
        assert!(ok(&c, s), "{s:?}");
    }
    for s in [
        "text <tool_call>",
        "<tool_call>\n{\"name\":\"sub\",\"arguments\":{}}\n</tool_call>",
        "<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":1}}\n</tool_call>",
        "<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}\n</tool_call> and more text",
    ] {
        assert!(!ok(&c, s), "{s:?}");
    }
    assert!(matches!(Grammar::new(&Expr::text_or_tool_calls("<t>", "</t>", vec![])), Err(GrammarError::Unsatisfiable(_))));
}

#[test]
fn build_errors() {
    assert!(matches!(Grammar::regex("a("), Err(GrammarError::InvalidRegex { .. })));
    assert!(matches!(Grammar::new(&Expr::regex("a*").repeat(0, None)), Err(GrammarError::NullableRepeat)));
    assert!(matches!(Grammar::new(&Expr::Choice(vec![])), Err(GrammarError::Unsatisfiable(_))));
    assert!(matches!(
        Grammar::new(&Expr::literal("a").repeat(3, Some(2))),
        Err(GrammarError::Unsatisfiable(_))
    ));
}

#[test]
fn left_recursion_is_reported_not_looped() {
    // value := value "x" | "y"  (left recursive): the expansion must stop with Loop.
    let mut b = Builder::new(JsonOptions::default());
    let v = b.choice(vec![]);
    let x = b.lit("x");
    let y = b.lit("y");
    let rec = b.seq(vec![v, x]);
    b.nodes[v as usize] = Node::Choice(vec![rec, y].into());
    let r = Grammar::from_parts(b.nodes, b.dfas, v);
    assert!(matches!(r, Err(GrammarError::Loop)), "{r:?}");
}

/// States where a value starts take the split path (the tops' tokens computed once,
/// the rests after them per state): every mask equals the plain walk, over random
/// documents, with tokens that run from one value into what follows it, and with stack
/// limits small enough that the tops' depth matters.
#[test]
fn split_masks_equal_the_walk() {
    let words = [
        "<eos>", "{", "}", "[", "]", ",", ":", "\"", "\"a", "\"a\"", "\"a\",", "\"\"", "\"\"}", "1", "12", "1,", "0}", "1]",
        "true", "true,", "null]", "false}", "[[", "[[[", "[{", "{\"", "{\"a\":", "{}", "[]", "[],", "{},", "]}", "}]",
        "a", "-", "-1", ".5", "0.5,", "\":", "\",\"", "t", "n", "nu", "f", "2", "0", "]]", "}}", "\":[", "\":{",
    ];
    let toks: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
    let idx = TokenIndex::new(toks, &[0], &[]);
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"a": {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": ["string", "null", "boolean"]}}]}, "b": {}},
        "required": ["a"]
    });
    let mut rand = xorshift(0x2545_f491_4f6c_dd1d);
    let mut split = 0;
    // After the first item, the stack below goes deeper than the item did (into the
    // separator): at the stack limit it cannot go on, and a token ending the item is not
    // allowed.
    let pair = serde_json::json!({"type": "array", "prefixItems": [{"type": ["integer", "null"]}, {"type": "integer"}], "items": false, "minItems": 2});
    for depth in (3u32..=16).chain([2048]) {
        let opts = JsonOptions { max_stack_depth: depth, ..JsonOptions::default() };
        for e in [Expr::Json, Expr::JsonSchema(schema.clone()), Expr::JsonSchema(pair.clone())] {
            let Ok(g) = Grammar::with_options(&e, opts) else { continue };
            let table = g.lexeme_table(&idx);
            for _ in 0..40 {
                let mut st = g.start();
                for _ in 0..30 {
                    let m = idx.mask(&g, &st).unwrap();
                    assert_eq!(m, idx.mask_by_walk(&g, &st).unwrap(), "depth {depth}, {e:?}, state {st:?}");
                    if st.num_stacks() > 1 && g.split_mask(&idx, &table, &st).unwrap().is_some() {
                        split += 1;
                    }
                    let allowed: Vec<u32> = m.iter().filter(|&t| t != 0).collect();
                    if allowed.is_empty() {
                        break;
                    }
                    let t = allowed[rand(allowed.len())];
                    st = g.advance_bytes(&st, words[t as usize].as_bytes()).unwrap().unwrap();
                }
            }
        }
    }
    assert!(split > 200, "{split} masks took the split path");
}

#[test]
fn states_roll_back() {
    let c = g(Expr::Json);
    let s1 = c.advance_bytes(&c.start(), b"[1,").unwrap().unwrap();
    let s2 = c.advance_bytes(&s1, b"2]").unwrap().unwrap();
    assert!(c.is_accepting(&s2) && !c.is_accepting(&s1));
    // Going back to s1 and taking another path works, s2 is untouched.
    let s3 = c.advance_bytes(&s1, b"\"x\"]").unwrap().unwrap();
    assert!(c.is_accepting(&s3) && c.is_accepting(&s2));
    assert_eq!(c.advance_bytes(&s1, b"2]").unwrap().unwrap(), s2);
}

/// The keys of an object that are not its listed names take their token sets from the
/// automaton of any key (shared between grammars): masks along random documents equal the
/// plain walk, with keys that run past, stop short of, or leave the listed names.
#[test]
fn aliased_key_states_mask_like_the_walk() {
    let words = [
        "<eos>", "{", "}", "\"", "\"a", "\"ab", "\"abc\"", "b", "c", "bc", "ab", "x", "xy", "\":", "\":1", "1", "12", ",", ",\"", "\"\":",
        "é", "\u{e9}x\"", "\"abd", "d\":", "\"x", "a\":\"", "s\"", "\"}", "0}", "\"zz\":", "\"z", "a\":", "a\":1",
    ];
    let toks: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
    let idx = TokenIndex::new(toks, &[0], &[]);
    let schema = serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}, "ab": {"type": "integer"}, "abc": {"type": "string"}}});
    let g = Grammar::json_schema(&schema).unwrap();
    assert!(g.dfas.iter().any(|d| d.alias.is_some()), "the extra keys' automaton is a product with an alias");
    masks_along_random_walks_equal_the_walk(&g, &idx, &words, 0x9e37_79b9_7f4a_7c15, 200, 20, "");
}

/// A string pattern searched anywhere is any text once found: those states take the token
/// sets of the any-text automaton (shared between grammars). Masks along random documents
/// equal the plain walk, with tokens that complete the pattern, run past it, or close the
/// string.
#[test]
fn found_pattern_states_mask_like_the_walk() {
    let words = [
        "<eos>", "{", "}", "\"", "\"a", "ab", "b", "abc", "c\"", "\"x", "xab", "é", "\u{e9}b\"", "\\n", "\":", "\"}", "a\"}", "\"s", "s\":", "\\", "1", "\"ab\"",
    ];
    let toks: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
    let idx = TokenIndex::new(toks, &[0], &[]);
    let schema = serde_json::json!({"type": "object", "properties": {"s": {"type": "string", "pattern": "ab"}}, "required": ["s"], "additionalProperties": false});
    let g = Grammar::json_schema(&schema).unwrap();
    let aliased = g.dfas.iter().filter_map(|d| d.alias.as_ref()).map(|a| a.base_of.iter().filter(|&&b| b != crate::dfa::DEAD).count()).sum::<usize>();
    assert!(aliased > 0, "the pattern's automaton has states aliased to any text");
    masks_along_random_walks_equal_the_walk(&g, &idx, &words, 0x2545_f491_4f6c_dd1d, 200, 20, "");
}

/// Length-bounded strings take their token sets from the tokens sorted by how many
/// characters they hold (no walk per count): masks along random documents equal the plain
/// walk at every count, with tokens of several characters, escapes, multi-byte characters,
/// and tokens that close the string and go on.
#[test]
fn bounded_string_masks_equal_the_walk() {
    let words = [
        "<eos>", "{", "}", "\"", "\"a", "ab", "abc", "abcd", "b", "é", "éé", "\\n", "\\u00e9", "\\u", "00", "e9", "\",", "\"}", "a\",", "ab\"}", "\"s\":", "\"t\":", "\":\"", "\\", "1", "\"\"", "x\"", ",",
        "\u{1F600}", "\u{1F600}a",
    ];
    let toks: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
    let idx = TokenIndex::new(toks, &[0], &[]);
    for (lo, hi) in [(2, Some(5)), (0, Some(1)), (3, None), (4, Some(4))] {
        let mut s = serde_json::json!({"type": "string", "minLength": lo});
        if let Some(h) = hi {
            s["maxLength"] = h.into();
        }
        let schema = serde_json::json!({"type": "object", "properties": {"s": s, "t": s}, "required": ["s"], "additionalProperties": false});
        let g = Grammar::json_schema(&schema).unwrap();
        assert!(g.dfas.iter().any(|d| d.counted().is_some()), "{lo}..{hi:?}: the bounded string is built as counted");
        let done = masks_along_random_walks_equal_the_walk(&g, &idx, &words, 0x2545_f491_4f6c_dd1d, 150, 24, &format!("{lo}..{hi:?}: "));
        assert!(done > 10, "{lo}..{hi:?}: {done} walks finished a document");
    }
}

/// Random walks of `walks` documents of up to `steps` tokens over the allowed tokens (id 0,
/// the end, never taken), asserting at each state that the mask equals the plain walk's;
/// returns how many states met were accepting.
fn masks_along_random_walks_equal_the_walk(g: &Grammar, idx: &TokenIndex, words: &[&str], seed: u64, walks: usize, steps: usize, what: &str) -> usize {
    let mut rand = xorshift(seed);
    let mut accepting = 0;
    for _ in 0..walks {
        let mut st = g.start();
        for _ in 0..steps {
            let m = idx.mask(g, &st).unwrap();
            assert_eq!(m, idx.mask_by_walk(g, &st).unwrap(), "{what}state {st:?}");
            accepting += usize::from(g.is_accepting(&st));
            let allowed: Vec<u32> = m.iter().filter(|&t| t != 0).collect();
            if allowed.is_empty() {
                break;
            }
            let t = allowed[rand(allowed.len())];
            st = g.advance_bytes(&st, words[t as usize].as_bytes()).unwrap().unwrap();
        }
    }
    accepting
}

/// A seeded pick below `n` (xorshift), for random walks over the allowed tokens.
fn xorshift(mut seed: u64) -> impl FnMut(usize) -> usize {
    move |n| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    }
}

/// The token sets of a key automaton's states that still follow a listed name, derived
/// from the any-key automaton's sets ([`TokenIndex::lexeme_tokens_shadowed`]), equal those
/// of a walk of the whole trie with the product: the same tokens inside, and the same
/// tokens leaving into the same states with the same rests. The vocabulary holds every
/// string of up to four bytes over the names' letters, quotes, escapes and a multi-byte
/// character, so tokens follow, complete, run past and leave the names at every point.
#[test]
fn shadowed_key_sets_equal_the_walk() {
    let alphabet: [&[u8]; 9] = [b"a", b"b", b"c", b"\"", b":", b"\\", b"1", "é".as_bytes(), &[0xC3]];
    let mut words: Vec<Vec<u8>> = vec![b"<eos>".to_vec()];
    let mut layer: Vec<Vec<u8>> = vec![Vec::new()];
    for _ in 0..4 {
        layer = layer.iter().flat_map(|w| alphabet.iter().map(move |a| [w.as_slice(), a].concat())).collect();
        words.extend(layer.iter().cloned());
    }
    let idx = TokenIndex::new(words, &[0], &[]);
    let schema = serde_json::json!({"type": "object", "properties": {"a": {}, "ab": {}, "abc": {}, "bé": {}, "c1": {}}});
    let g = Grammar::json_schema(&schema).unwrap();
    let mut checked = 0;
    for dfa in g.dfas.iter() {
        let Some(alias) = dfa.alias.as_ref().filter(|a| !a.shadow.is_empty()) else { continue };
        for s in (0..dfa.num_states() as u32).filter(|&s| alias.base_of[s as usize] == crate::dfa::DEAD) {
            let base = idx.lexeme_tokens(&alias.base, alias.shadow[s as usize]);
            let derived = idx.lexeme_tokens_shadowed(dfa, s, alias, &base).expect("the base's sets apply");
            let walked = idx.lexeme_tokens(dfa, s);
            assert_eq!(derived.inner, walked.inner, "state {s}: tokens inside");
            let rests = |lt: &crate::vocab::LexemeTokens| {
                let mut v: Vec<(u32, Vec<u8>, u32)> = lt.groups.iter().flat_map(|gr| (0..gr.len()).flat_map(move |k| {
                    let (r, toks) = gr.rest(k);
                    toks.iter().map(move |&t| (dfa.next(gr.p, gr.b), r.to_vec(), t))
                })).collect();
                v.sort();
                v
            };
            assert_eq!(rests(&derived), rests(&walked), "state {s}: tokens leaving");
            checked += 1;
        }
    }
    assert!(checked >= 5, "{checked} states still following a name were checked");
}
