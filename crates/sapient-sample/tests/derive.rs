//! `#[derive(Schema, Parse)]`: the derived schema is the JSON Schema we expect, the grammar
//! built from it and the parser agree, and documents generated from the grammar parse.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sapient_sample::{Matcher, Parse, ParseError, Schema, TokenIndex};
use serde_json::json;
use std::sync::Arc;

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
                }, "required": ["name", "cost"]}}, "required": ["Spell"]},
                {"type": "object", "properties": {"Bonus": {"type": "integer", "minimum": i64::MIN, "maximum": i64::MAX}}, "required": ["Bonus"]}
            ]}, "maxItems": 3}
        },
        "required": ["name", "age", "description", "class", "skills"],
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
        r#"{"age": 3, "name": "Ada Lovelace", "description": "x", "class": "Mage", "skills": []}"#,
    ] {
        assert_eq!(Character::parse(bad), Err(ParseError::Rejected), "{bad}");
    }
    assert_eq!(Score::parse("99"), Ok(Score(99)));
    assert_eq!(Score::parse("100"), Err(ParseError::Rejected));
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
}

#[test]
fn accepted_prefix_points_at_the_error() {
    let text = r#"{"name": "Ada lovelace"}"#;
    // "Ada l": the second word must start with a capital.
    assert_eq!(sapient_sample::typed::accepted_prefix::<Character>(text).unwrap(), text.find(" l").unwrap() + 1);
}
