use crate::{Constraint, Grammar, GrammarError};

fn g(src: &str) -> Grammar {
    match Grammar::gbnf(src) {
        Ok(g) => g,
        Err(e) => panic!("{src:?}: {e}"),
    }
}

fn ok(g: &Grammar, s: &str) -> bool {
    g.matches(s.as_bytes()).unwrap()
}

/// The (line, column, message) of a GBNF error.
fn err(src: &str) -> (usize, usize, String) {
    match Grammar::gbnf(src) {
        Err(GrammarError::Gbnf { line, column, message }) => (line, column, message),
        other => panic!("{src:?}: expected a GBNF error, got {other:?}"),
    }
}

#[test]
fn literals_and_escapes() {
    let c = g(r#"root ::= "a\"b\\c\n\t\r" "\x41\u00e9\U0001F600" "[\]\-" "日本""#);
    assert!(ok(&c, "a\"b\\c\n\t\rAé😀[]-日本"));
    assert!(!ok(&c, "a\"b\\c\n\t\rAé😀[]-日"));
    // \xHH is a code point (U+0085), written as UTF-8, as in llama.cpp.
    let c = g(r#"root ::= "\x85""#);
    assert!(ok(&c, "\u{85}") && !c.matches(&[0x85]).unwrap());
}

#[test]
fn classes_any_and_repetitions() {
    let c = g(r#"root ::= [a-c0-9_-]+ [^\n"]* "." . [\]\\]"#);
    assert!(ok(&c, "a0_-xyz é.\n]") && ok(&c, "b.日\\"));
    assert!(!ok(&c, "d.x]") && !ok(&c, "a\"..]") && !ok(&c, "a.x") && !ok(&c, "a\n.x]"));
    // A trailing `-` is literal.
    let c = g("root ::= [a-]");
    assert!(ok(&c, "-") && ok(&c, "a") && !ok(&c, "b"));
    let c = g(r#"root ::= "ab"{2} "c"{1,} "d"{0,2} "e"? "f"*"#);
    for (s, want) in [("ababc", true), ("abab", false), ("ababcccdde", true), ("ababcddd", false), ("ababcefff", true), ("abcc", false)] {
        assert_eq!(ok(&c, s), want, "{s}");
    }
    let c = g("root ::= (\"x\" | \"y\"){2,3}");
    assert!(!ok(&c, "x") && ok(&c, "xy") && ok(&c, "yxy") && !ok(&c, "xyxy"));
}

#[test]
fn layout_comments_and_groups() {
    let src = "# a comment\nroot ::= item (\n  \",\" # inside parentheses, lines may break\n  item\n)*\n\nitem ::= \"a\" |\n  \"b\" # after | too\n";
    let c = g(src);
    assert!(ok(&c, "a") && ok(&c, "a,b,a") && !ok(&c, "a,") && !ok(&c, ""));
    // CRLF line ends.
    let c = g("root ::= a\r\na ::= \"x\"\r\n");
    assert!(ok(&c, "x"));
}

#[test]
fn recursion_and_regular_parts() {
    // Balanced parentheses: recursive (nodes), with regular parts (lexemes) inside.
    let c = g("root ::= expr\nexpr ::= term ([+*] term)*\nterm ::= num | \"(\" expr \")\"\nnum ::= [0-9]+ ws\nws ::= \" \"?");
    for (s, want) in [("1", true), ("(1+2 )*3", true), ("((4))", true), ("(1", false), ("1)", false), ("+1", false), ("12 +(3*4 )", true)] {
        assert_eq!(ok(&c, s), want, "{s}");
    }
    // A regular rule is one lexeme: the grammar has few nodes.
    let c = g("root ::= w (\" \" w)*\nw ::= [a-z]+ | [0-9]+");
    assert_eq!(c.num_nodes(), 1, "one DFA");
    assert!(ok(&c, "ab 12 c") && !ok(&c, "ab12") && !ok(&c, "ab  c"));
}

#[test]
fn errors_name_line_and_column() {
    let (l, c, m) = err("root ::= a\na ::= b");
    assert_eq!((l, c), (2, 7), "{m}");
    assert!(m.contains("undefined rule `b`"), "{m}");
    let (l, c, m) = err("root ::= (\"a\" | \"b\"\n");
    assert!(m.contains("unbalanced `(`") && (l, c) == (2, 1), "{l}:{c} {m}");
    let (l, c, m) = err("root ::= \"a\")");
    assert!(m.contains("unbalanced `)`") && (l, c) == (1, 13), "{l}:{c} {m}");
    let (l, c, m) = err("root ::= \"a\\qb\"");
    assert!(m.contains("unknown escape `\\q`") && (l, c) == (1, 12), "{l}:{c} {m}");
    let (_, _, m) = err("root ::= \"\\x4\"");
    assert!(m.contains("needs 2 hex digits"), "{m}");
    let (l, c, m) = err("root ::= expr\nexpr ::= expr \"+\" num | num\nnum ::= [0-9]+");
    assert!(m.contains("left-recursive (expr -> expr)") && (l, c) == (2, 1), "{l}:{c} {m}");
    let (_, _, m) = err("root ::= a\na ::= b? c\nb ::= \"x\"?\nc ::= a \"y\" | \"z\"");
    assert!(m.contains("left-recursive") && m.contains("a -> c -> a"), "{m}");
    let (l, _, m) = err("root ::= \"a\"\nroot ::= \"b\"");
    assert!(m.contains("defined twice (first on line 1)") && l == 2, "{m}");
    for (src, want) in [
        ("rot ::= \"a\"", "no `root` rule"),
        ("root ::= <[123]>", "token references"),
        ("root ::= \"abc", "unterminated string"),
        ("root ::= [abc", "unterminated character class"),
        ("root ::= * \"a\"", "nothing before it"),
        ("root ::= [z-a]", "reversed"),
        ("root ::= \"a\"{3,2}", "below the minimum"),
        ("my_rule ::= \"a\"", "not `_`"),
        ("root ::= \"a\" root", "can never finish"),
        ("root ::= (r?)*\nr ::= \"(\" r \")\" | \"x\"", "can match the empty text"),
        ("root ::= []", "empty character class"),
        ("root ::= \"\\uD800\"", "not a Unicode scalar value"),
    ] {
        let (_, _, m) = err(src);
        assert!(m.contains(want), "{src:?}: {m}");
    }
    assert!(matches!(Grammar::gbnf(&"#".repeat(crate::MAX_GBNF_BYTES + 1)), Err(GrammarError::TooLarge { .. })));
    let deep = format!("root ::= {}\"a\"{}", "(".repeat(100), ")".repeat(100));
    let (_, _, m) = err(&deep);
    assert!(m.contains("nested more than"), "{m}");
}

#[test]
fn an_empty_repetition_inside_a_regex_is_fine() {
    // `(ws)*` with a nullable `ws` is regular: one DFA, no empty-loop problem.
    let c = g("root ::= (ws \"a\")* ws\nws ::= [ ]*");
    assert!(ok(&c, "  a a  ") && ok(&c, "") && !ok(&c, "b"));
}


#[test]
fn empty_literals_and_single_rule_bodies_between_recursive_rules() {
    // An empty literal beside recursion (a node of no bytes), a rule that is only another
    // recursive rule (its node refers to the other's), `{0}`.
    let c = g("root ::= \"\" p \"\" alias \"x\"{0}\np ::= \"(\" p \")\" | \"\"\nalias ::= p");
    for (s, want) in [("", true), ("()", true), ("(())()", true), ("(()", false), (")(", false), ("x", false)] {
        assert_eq!(ok(&c, s), want, "{s:?}");
    }
}

