//! `#[derive(Schema, Parse)]`: the derived schema is the JSON Schema we expect, the grammar
//! built from it and the parser agree, and documents generated from the grammar parse.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sapient_sample::{Matcher, Parse, ParseError, Schema, TokenIndex};
use serde_json::json;
use std::sync::Arc;

mod common;

/// kalosm's example, extended with an enum, an optional field and a list of data variants.
#[derive(Debug, Clone, PartialEq, Schema, Parse)]
struct Character {
    /// The character's full name.
    #[parse(pattern = r"^[A-Z][a-z]{1,10} [A-Z][a-z]{1,10}$")]
    name: String,
    #[parse(range = 1..=100)]
    age: u8,
    /// What they are like.
    #[parse(max_len = 80)]
    description: String,
    class: Class,
    nickname: Option<String>,
    #[parse(rename = "skills", max_items = 3)]
    abilities: Vec<Ability>,
}

#[derive(Debug, Clone, PartialEq, Schema, Parse)]
enum Class {
    Warrior,
    Mage,
    #[parse(rename = "rogue")]
    Rogue,
}

#[derive(Debug, Clone, PartialEq, Schema, Parse)]
enum Ability {
    Passive,
    Spell {
        name: String,
        #[parse(range = 0..=10)]
        cost: i32,
    },
    Bonus(i64),
}

#[derive(Debug, Clone, PartialEq, Schema, Parse)]
struct Score(#[parse(range = 0..100)] u32);

#[test]
fn derived_schema_is_the_expected_json_schema() {
    let s = Character::json_schema();
    let expected = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,10} [A-Z][a-z]{1,10}$", "description": "The character's full name."},
            "age": {"type": "integer", "minimum": 1, "maximum": 100},
            "description": {"type": "string", "maxLength": 80, "description": "What they are like."},
            "class": {"enum": ["Warrior", "Mage", "rogue"]},
            "nickname": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "skills": {"type": "array", "items": {"anyOf": [
                {"enum": ["Passive"]},
                {"type": "object", "properties": {"Spell": {"type": "object", "properties": {
                    "name": {"type": "string"},
                    "cost": {"type": "integer", "minimum": 0, "maximum": 10}
                }, "required": ["name", "cost"], "additionalProperties": false}}, "required": ["Spell"], "additionalProperties": false},
                {"type": "object", "properties": {"Bonus": {"type": "integer", "minimum": i64::MIN, "maximum": i64::MAX}}, "required": ["Bonus"], "additionalProperties": false}
            ]}, "maxItems": 3}
        },
        "required": ["name", "age", "description", "class", "skills"],
        "additionalProperties": false,
        "description": "kalosm's example, extended with an enum, an optional field and a list of data variants."
    });
    assert_eq!(s, expected, "{}", serde_json::to_string_pretty(&s).unwrap());
    // Property order is the field order (the grammar generates them in this order).
    let keys: Vec<&String> = s["properties"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["name", "age", "description", "class", "nickname", "skills"]);
    assert_eq!(Score::json_schema(), json!({"type": "integer", "minimum": 0, "maximum": u32::MAX, "exclusiveMaximum": 100}));
}

#[test]
fn parse_accepts_exactly_the_schema() {
    let text = r#"{"name": "Ada Lovelace", "age": 36, "description": "Wrote the first program.", "class": "Mage",
        "skills": [{"Spell": {"name": "Analytical Engine", "cost": 7}}, "Passive", {"Bonus": -3}]}"#;
    let c = Character::parse(text).unwrap();
    assert_eq!(
        c,
        Character {
            name: "Ada Lovelace".into(),
            age: 36,
            description: "Wrote the first program.".into(),
            class: Class::Mage,
            nickname: None,
            abilities: vec![Ability::Spell { name: "Analytical Engine".into(), cost: 7 }, Ability::Passive, Ability::Bonus(-3)],
        }
    );
    let with_nick = r#"{"name": "Ada Lovelace", "age": 36, "description": "x", "class": "rogue", "nickname": "Enchantress", "skills": []}"#;
    let c = Character::parse(with_nick).unwrap();
    assert_eq!((c.class, c.nickname.as_deref()), (Class::Rogue, Some("Enchantress")));
    for bad in [
        r#"{"name": "Ada Lovelace", "age": 0, "description": "x", "class": "Mage", "skills": []}"#,
        r#"{"name": "ada lovelace", "age": 3, "description": "x", "class": "Mage", "skills": []}"#,
        r#"{"name": "Ada Lovelace", "age": 3, "description": "x", "class": "Rogue", "skills": []}"#,
        r#"{"name": "Ada Lovelace", "age": 3, "description": "x", "class": "Mage"}"#,
        r#"{"name": "Ada Lovelace", "age": 3, "description": "x", "class": "Mage", "skills": [], "extra": 1}"#,
        r#"{"name": "Ada Lovelace", "age": 3, "description": "x", "class": "Mage", "skills": [{"Spell": {"name": "a", "cost": 11}}]}"#,
        r#"{"name": "Ada Lovelace", "age": 3, "description": "x", "class": "Mage", "skills": ["Passive", "Passive", "Passive", "Passive"]}"#,
        r#"{"name": "Ada Lovelace", "age": 3.5, "description": "x", "class": "Mage", "skills": []}"#,
        r#"{"name": "Ada Lovelace", "age": 3, "description": "x", "class": "Mage", "skills": [{"Bonus": 1, "Passive": 2}]}"#,
    ] {
        assert!(matches!(Character::parse(bad), Err(ParseError::Invalid(_))), "{bad}: {:?}", Character::parse(bad));
    }
    assert!(matches!(Character::parse(r#"{"name": "Ada Lovelace""#), Err(ParseError::Json(_))));
    // What the schema describes but the grammar does not write is accepted too: other key
    // orders, any whitespace, escapes in a patterned string, integers written as 3.0.
    let reordered = r#"{"skills":[],"age":3.0,   "class":"Mage","description":"x","name":"Ad\u0061 Lovelace"}"#;
    assert_eq!(sapient_sample::typed::accepted_prefix::<Character>(reordered).unwrap(), 2, "the grammar writes \"name\" first");
    let c = Character::parse(reordered).unwrap();
    assert_eq!((c.name.as_str(), c.age), ("Ada Lovelace", 3));
    assert_eq!(Score::parse("99"), Ok(Score(99)));
    assert!(matches!(Score::parse("100"), Err(ParseError::Invalid(_))));
    // from_json alone (no grammar) still type-checks.
    assert!(matches!(Class::from_json(&json!("Paladin")), Err(ParseError::Type { .. })));
    assert!(matches!(Character::from_json(&json!({"name": "A B"})), Err(ParseError::Missing(_))));
}

#[test]
fn random_documents_from_the_derived_grammar_parse() {
    let mut toks: Vec<Vec<u8>> = vec![b"</s>".to_vec()];
    toks.extend((0x20u8..0x7F).map(|b| vec![b]));
    for t in ["\n", "é", "\": ", "\", \"", "Spell", "Passive", "Bonus", "Mage", "rogue", "null", "10", "skills"] {
        toks.push(t.as_bytes().to_vec());
    }
    let index = Arc::new(TokenIndex::new(toks.clone(), &[0], &[]));
    let g = Character::grammar().unwrap();
    let mut rng = StdRng::seed_from_u64(9);
    let mut variants = std::collections::BTreeSet::new();
    let mut agree = [0usize; 2];
    for i in 0..100 {
        let mut m = Matcher::new(g.clone(), index.clone());
        let mut text = Vec::new();
        loop {
            assert!(text.len() < 50_000, "#{i}: runaway");
            let mask = m.mask().unwrap();
            let allowed: Vec<u32> = mask.iter().filter(|&t| t != 0).collect();
            let t = if allowed.is_empty() || (mask.is_allowed(0) && rng.random::<f32>() < 0.5) { 0 } else { allowed[rng.random_range(0..allowed.len())] };
            m.consume(t).unwrap();
            if t == 0 {
                break;
            }
            text.extend_from_slice(&toks[t as usize]);
        }
        let s = String::from_utf8(text).unwrap();
        let c = Character::parse(&s).unwrap_or_else(|e| panic!("#{i}: {e}: {s}"));
        // The parser accepts exactly what the schema describes: edited copies are accepted
        // by `parse` exactly when an independent validator accepts them.
        let schema = Character::json_schema();
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        for edited in common::mutations(&v, &mut rng, 5) {
            let text = serde_json::to_string(&edited).unwrap();
            let ours = Character::parse(&text);
            let theirs = common::valid(&schema, &schema, &edited);
            assert_eq!(ours.is_ok(), theirs.is_ok(), "{text}: parse {ours:?}, independent {theirs:?}");
            agree[ours.is_ok() as usize] += 1;
        }
        assert!((1..=100).contains(&c.age) && c.abilities.len() <= 3 && c.description.chars().count() <= 80);
        for a in &c.abilities {
            variants.insert(match a {
                Ability::Passive => "passive",
                Ability::Spell { cost, .. } => {
                    assert!((0..=10).contains(cost));
                    "spell"
                }
                Ability::Bonus(_) => "bonus",
            });
        }
    }
    assert_eq!(variants.len(), 3, "every variant was generated: {variants:?}");
    assert!(agree[0] >= 50 && agree[1] >= 50, "edited copies test both answers: {agree:?}");
}

#[test]
fn accepted_prefix_points_at_the_error() {
    let text = r#"{"name":"Ada lovelace"}"#;
    // "Ada l": the second word must start with a capital.
    assert_eq!(sapient_sample::typed::accepted_prefix::<Character>(text).unwrap(), text.find(" l").unwrap() + 1);
}

/// A recursive type: a tree of sections, each with an optional boxed note.
#[derive(Debug, Clone, PartialEq, Schema, Parse)]
struct Section {
    #[parse(max_len = 12)]
    title: String,
    #[parse(max_items = 2)]
    children: Vec<Section>,
    note: Option<Box<Note>>,
}

/// Mutually recursive with itself through `Option<Box<_>>`, below a non-recursive root.
#[derive(Debug, Clone, PartialEq, Schema, Parse)]
struct Note {
    #[parse(max_len = 8)]
    text: String,
    reply: Option<Box<Note>>,
}

#[derive(Debug, Clone, PartialEq, Schema, Parse)]
struct Book {
    #[parse(max_items = 3)]
    sections: Vec<Section>,
    foreword: Option<Note>,
}

#[test]
fn recursive_types_use_refs() {
    let s = Section::json_schema();
    assert_eq!(s["properties"]["children"], json!({"type": "array", "items": {"$ref": "#"}, "maxItems": 2}));
    let note_key = s["properties"]["note"]["anyOf"][0]["$ref"].as_str().unwrap().strip_prefix("#/$defs/").unwrap().to_string();
    assert!(note_key.ends_with("Note"), "{note_key}");
    assert_eq!(s["$defs"][&note_key]["properties"]["reply"]["anyOf"][0], json!({"$ref": format!("#/$defs/{note_key}")}));
    // Below a non-recursive root, or inside a Vec at the root, `$defs` sit at the root.
    let b = Book::json_schema();
    let defs = b["$defs"].as_object().unwrap();
    assert_eq!(defs.len(), 2, "{b:#}");
    assert_eq!(b["properties"]["sections"]["items"]["$ref"].as_str().unwrap(), format!("#/$defs/{}", defs.keys().find(|k| k.ends_with("Section")).unwrap()));
    let v = <Vec<Note>>::json_schema();
    assert!(v["$defs"].is_object() && v["items"]["$ref"].is_string(), "{v:#}");
    // Building a schema twice gives the same (the thread-local state is left clean).
    assert_eq!(Book::json_schema(), b);

    let text = r#"{"sections": [{"title": "One", "children": [{"title": "One.a", "children": [], "note": {"text": "n", "reply": {"text": "r"}}}], "note": null}], "foreword": {"text": "f"}}"#;
    let book = Book::parse(text).unwrap();
    assert_eq!(book.sections[0].children[0].note.as_ref().unwrap().reply.as_ref().unwrap().text, "r");
    assert!(matches!(Book::parse(r#"{"sections": [{"title": "One", "children": [{"title": "x", "children": [], "note": {"reply": null}}]}]}"#), Err(ParseError::Invalid(_))));
    assert!(matches!(Book::parse(r#"{"sections": [{"title": "x", "children": [{"title": "a", "children": []}, {"title": "b", "children": []}, {"title": "c", "children": []}]}]}"#), Err(ParseError::Invalid(_))));

    // The grammar generates recursive documents that parse.
    let mut toks: Vec<Vec<u8>> = vec![b"</s>".to_vec()];
    toks.extend((0x20u8..0x7F).map(|b| vec![b]));
    for t in ["\"title\": ", "\"children\": [", "\"note\": ", "\"reply\": ", "\"text\": ", "null", "{", "}"] {
        toks.push(t.as_bytes().to_vec());
    }
    let index = Arc::new(TokenIndex::new(toks.clone(), &[0], &[]));
    let g = Book::grammar().unwrap();
    let mut rng = StdRng::seed_from_u64(4);
    let mut deepest = 0;
    for i in 0..100 {
        let mut m = Matcher::new(g.clone(), index.clone());
        let mut text = Vec::new();
        loop {
            assert!(text.len() < 50_000, "#{i}: runaway");
            let mask = m.mask().unwrap();
            let allowed: Vec<u32> = mask.iter().filter(|&t| t != 0).collect();
            // Uniform picks nest without end; closing a level a third of the time when
            // possible keeps documents finite and still several levels deep.
            let closing: Vec<u32> = allowed.iter().copied().filter(|&t| matches!(&toks[t as usize][..], b"]" | b"}" | b"null")).collect();
            let t = if allowed.is_empty() || (mask.is_allowed(0) && rng.random::<f32>() < 0.5) {
                0
            } else if !closing.is_empty() && rng.random::<f32>() < 0.35 {
                closing[rng.random_range(0..closing.len())]
            } else {
                allowed[rng.random_range(0..allowed.len())]
            };
            m.consume(t).unwrap();
            if t == 0 {
                break;
            }
            text.extend_from_slice(&toks[t as usize]);
        }
        let s = String::from_utf8(text).unwrap();
        let book = Book::parse(&s).unwrap_or_else(|e| panic!("#{i}: {e}: {s}"));
        fn depth(s: &Section) -> usize {
            1 + s.children.iter().map(depth).max().unwrap_or(0)
        }
        deepest = deepest.max(book.sections.iter().map(depth).max().unwrap_or(0));
    }
    assert!(deepest >= 3, "nested sections were generated: depth {deepest}");
}
