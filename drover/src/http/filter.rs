//! `?filter=` expressions (Nomad 1.3+'s go-bexpr language), evaluated on
//! an object as the API answers it in JSON (Nomad's field names).
//!
//! The language:
//! 1. Matches: `Sel == "v"`, `Sel != "v"`, `Sel is empty`, `Sel is not
//!    empty`, `"v" in Sel`, `"v" not in Sel`, `Sel contains "v"`, `Sel not
//!    contains "v"`, `Sel matches "re"`, `Sel not matches "re"`.
//! 2. Logic: `and`, `or`, `not` and parentheses; `not` binds tightest,
//!    then `and`, then `or`.
//! 3. Selectors: field names joined by dots (`Status`, `Meta.owner`), a map
//!    key with dots in `["..."]`. Through a list, a match holds when it
//!    holds for any element.
//! 4. Values: `"..."` strings with escapes, backtick raw strings, numbers
//!    and bare words (`true`); compared as text with the field's value
//!    (`3` matches the number 3, `true` the boolean).
//! 5. `in` and `contains` look for a substring in text, an element in a
//!    list, a key in a map.

use regex::Regex;
use serde_json::Value;

/// A parsed expression.
#[derive(Clone, Debug)]
pub enum Filter {
    /// Both hold.
    And(Box<Filter>, Box<Filter>),
    /// Either holds.
    Or(Box<Filter>, Box<Filter>),
    /// It does not hold.
    Not(Box<Filter>),
    /// One match (step 1).
    Match {
        /// The field path.
        selector: Vec<String>,
        /// What is checked.
        test: Test,
        /// Whether the check is negated (`!=`, `not in`, `is not empty`, ...).
        negated: bool,
    },
}

/// What a match checks.
#[derive(Clone, Debug)]
pub enum Test {
    /// `==`.
    Equal(String),
    /// `is empty`.
    Empty,
    /// `in`, `contains`.
    Contains(String),
    /// `matches`.
    Matches(Regex),
}

impl Filter {
    /// Parses `text`; the error says where it went wrong.
    pub fn parse(text: &str) -> Result<Filter, String> {
        let tokens = tokenize(text)?;
        let mut parser = Parser { tokens, position: 0 };
        let filter = parser.or()?;
        match parser.tokens.get(parser.position) {
            None => Ok(filter),
            Some(token) => Err(format!("unexpected {token:?} after a complete expression")),
        }
    }

    /// Whether `object` passes.
    pub fn matches(&self, object: &Value) -> bool {
        match self {
            Filter::And(left, right) => left.matches(object) && right.matches(object),
            Filter::Or(left, right) => left.matches(object) || right.matches(object),
            Filter::Not(inner) => !inner.matches(object),
            Filter::Match { selector, test, negated } => {
                let mut found = Vec::new();
                select(object, selector, &mut found);
                found.iter().any(|value| test.holds(value)) != *negated
            }
        }
    }
}

impl Test {
    fn holds(&self, value: &Value) -> bool {
        match self {
            Test::Equal(wanted) => text(value).is_some_and(|text| text == *wanted),
            Test::Empty => match value {
                Value::Null => true,
                Value::String(text) => text.is_empty(),
                Value::Array(items) => items.is_empty(),
                Value::Object(map) => map.is_empty(),
                _ => false,
            },
            Test::Contains(wanted) => match value {
                Value::String(text) => text.contains(wanted.as_str()),
                Value::Array(items) => items.iter().any(|item| text(item).is_some_and(|text| text == *wanted)),
                Value::Object(map) => map.contains_key(wanted),
                _ => false,
            },
            Test::Matches(regex) => text(value).is_some_and(|text| regex.is_match(&text)),
        }
    }
}

/// A scalar as text (step 4).
fn text(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        Value::Bool(flag) => Some(flag.to_string()),
        _ => None,
    }
}

/// The values at `path` under `value`, through lists (step 3).
fn select<'a>(value: &'a Value, path: &[String], found: &mut Vec<&'a Value>) {
    let Some((first, rest)) = path.split_first() else {
        found.push(value);
        return;
    };
    match value {
        Value::Object(map) => {
            if let Some(inner) = map.get(first) {
                select(inner, rest, found);
            }
        }
        Value::Array(items) => {
            for item in items {
                select(item, path, found);
            }
        }
        _ => {}
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    /// A bare word: a field name, an operator word or a bare value.
    Word(String),
    /// A quoted string.
    Quoted(String),
    Symbol(&'static str),
}

fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some(&(at, c)) = chars.peek() {
        match c {
            _ if c.is_whitespace() => {
                chars.next();
            }
            '(' | ')' | '[' | ']' | '.' => {
                chars.next();
                tokens.push(Token::Symbol(match c {
                    '(' => "(",
                    ')' => ")",
                    '[' => "[",
                    ']' => "]",
                    _ => ".",
                }));
            }
            '=' | '!' => {
                chars.next();
                match chars.next() {
                    Some((_, '=')) => tokens.push(Token::Symbol(if c == '=' { "==" } else { "!=" })),
                    _ => return Err(format!("expected {c}= at position {at}")),
                }
            }
            '"' => {
                chars.next();
                let mut value = String::new();
                loop {
                    match chars.next() {
                        None => return Err(format!("unterminated string at position {at}")),
                        Some((_, '"')) => break,
                        Some((_, '\\')) => match chars.next() {
                            Some((_, 'n')) => value.push('\n'),
                            Some((_, 't')) => value.push('\t'),
                            Some((_, other)) => value.push(other),
                            None => return Err(format!("unterminated string at position {at}")),
                        },
                        Some((_, other)) => value.push(other),
                    }
                }
                tokens.push(Token::Quoted(value));
            }
            '`' => {
                chars.next();
                let mut value = String::new();
                loop {
                    match chars.next() {
                        None => return Err(format!("unterminated string at position {at}")),
                        Some((_, '`')) => break,
                        Some((_, other)) => value.push(other),
                    }
                }
                tokens.push(Token::Quoted(value));
            }
            _ if c.is_alphanumeric() || c == '_' || c == '-' => {
                let mut word = String::new();
                while let Some(&(_, c)) = chars.peek() {
                    if !(c.is_alphanumeric() || c == '_' || c == '-') {
                        break;
                    }
                    word.push(c);
                    chars.next();
                }
                tokens.push(Token::Word(word));
            }
            other => return Err(format!("unexpected {other:?} at position {at}")),
        }
    }
    Ok(tokens)
}

struct Parser {
    tokens: Vec<Token>,
    position: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.position)
    }

    fn peek_word(&self, word: &str) -> bool {
        matches!(self.peek(), Some(Token::Word(found)) if found == word)
    }

    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.position).cloned();
        self.position += 1;
        token
    }

    fn expect_word(&mut self, word: &str) -> Result<(), String> {
        match self.next() {
            Some(Token::Word(found)) if found == word => Ok(()),
            other => Err(format!("expected {word:?}, found {other:?}")),
        }
    }

    fn or(&mut self) -> Result<Filter, String> {
        let mut left = self.and()?;
        while self.peek_word("or") {
            self.position += 1;
            left = Filter::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Filter, String> {
        let mut left = self.unary()?;
        while self.peek_word("and") {
            self.position += 1;
            left = Filter::And(Box::new(left), Box::new(self.unary()?));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Filter, String> {
        if self.peek_word("not") {
            self.position += 1;
            return Ok(Filter::Not(Box::new(self.unary()?)));
        }
        if self.peek() == Some(&Token::Symbol("(")) {
            self.position += 1;
            let inner = self.or()?;
            return match self.next() {
                Some(Token::Symbol(")")) => Ok(inner),
                other => Err(format!("expected \")\", found {other:?}")),
            };
        }
        self.matcher()
    }

    /// Step 1: a value first (`"v" in Sel`) or a selector first.
    fn matcher(&mut self) -> Result<Filter, String> {
        if let Some(Token::Quoted(value)) = self.peek().cloned() {
            self.position += 1;
            let negated = self.peek_word("not");
            if negated {
                self.position += 1;
            }
            self.expect_word("in")?;
            let selector = self.selector()?;
            return Ok(Filter::Match { selector, test: Test::Contains(value), negated });
        }
        let selector = self.selector()?;
        let (test, negated) = match self.next() {
            Some(Token::Symbol("==")) => (Test::Equal(self.value()?), false),
            Some(Token::Symbol("!=")) => (Test::Equal(self.value()?), true),
            Some(Token::Word(word)) if word == "is" => {
                let negated = self.peek_word("not");
                if negated {
                    self.position += 1;
                }
                self.expect_word("empty")?;
                (Test::Empty, negated)
            }
            Some(Token::Word(word)) if word == "not" => match self.next() {
                Some(Token::Word(word)) if word == "contains" => (Test::Contains(self.value()?), true),
                Some(Token::Word(word)) if word == "matches" => (self.regex()?, true),
                other => return Err(format!("expected \"contains\" or \"matches\", found {other:?}")),
            },
            Some(Token::Word(word)) if word == "contains" => (Test::Contains(self.value()?), false),
            Some(Token::Word(word)) if word == "matches" => (self.regex()?, false),
            other => return Err(format!("expected a match operator, found {other:?}")),
        };
        Ok(Filter::Match { selector, test, negated })
    }

    fn regex(&mut self) -> Result<Test, String> {
        let pattern = self.value()?;
        Regex::new(&pattern).map(Test::Matches).map_err(|error| format!("invalid regular expression: {error}"))
    }

    fn selector(&mut self) -> Result<Vec<String>, String> {
        let mut path = match self.next() {
            Some(Token::Word(word)) if word.starts_with(|c: char| c.is_alphabetic()) => vec![word],
            other => return Err(format!("expected a selector, found {other:?}")),
        };
        loop {
            match self.peek() {
                Some(Token::Symbol(".")) => {
                    self.position += 1;
                    match self.next() {
                        Some(Token::Word(word)) => path.push(word),
                        other => return Err(format!("expected a field name after \".\", found {other:?}")),
                    }
                }
                Some(Token::Symbol("[")) => {
                    self.position += 1;
                    match (self.next(), self.next()) {
                        (Some(Token::Quoted(key)), Some(Token::Symbol("]"))) => path.push(key),
                        _ => return Err("expected [\"key\"]".to_string()),
                    }
                }
                _ => return Ok(path),
            }
        }
    }

    fn value(&mut self) -> Result<String, String> {
        match self.next() {
            Some(Token::Quoted(value)) => Ok(value),
            Some(Token::Word(mut word)) => {
                // A number with a fraction is tokenized as word, ".", word.
                while self.peek() == Some(&Token::Symbol(".")) {
                    match self.tokens.get(self.position + 1).cloned() {
                        Some(Token::Word(more)) => {
                            word = format!("{word}.{more}");
                            self.position += 2;
                        }
                        _ => break,
                    }
                }
                Ok(word)
            }
            other => Err(format!("expected a value, found {other:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn eval() -> Value {
        json!({
            "ID": "e1", "Status": "blocked", "Priority": 50, "JobID": "web.api",
            "Meta": {"owner": "ops", "a.b": "dotted"},
            "Tags": ["x", "y"], "Empty": "", "Groups": [{"Name": "one"}, {"Name": "two"}],
        })
    }

    fn holds(text: &str) -> bool {
        Filter::parse(text).unwrap_or_else(|error| panic!("{text}: {error}")).matches(&eval())
    }

    #[test]
    fn matches_hold_and_fail_as_bexpr_says() {
        for yes in [
            r#"Status == "blocked""#,
            r#"Status != "pending""#,
            "Priority == 50",
            r#"Meta.owner == "ops""#,
            r#"Meta["a.b"] == "dotted""#,
            "Empty is empty",
            "Tags is not empty",
            r#""x" in Tags"#,
            r#""z" not in Tags"#,
            r#"JobID contains "api""#,
            r#"Meta contains "owner""#,
            r#"Groups.Name == "two""#,
            r#"JobID matches "^web\\.""#,
            r#"Status == `blocked` and not (Priority == 10 or Tags contains "z")"#,
            r#"Status == "nope" or Priority == 50"#,
        ] {
            assert!(holds(yes), "{yes}");
        }
        for no in [
            r#"Status == "pending""#,
            "Tags is empty",
            r#"JobID not contains "api""#,
            r#"Missing == "x""#,
            r#"Status == "blocked" and Priority == 10"#,
            r#"JobID not matches "web""#,
        ] {
            assert!(!holds(no), "{no}");
        }
    }

    #[test]
    fn bad_expressions_are_refused_with_where() {
        for bad in [r#"Status = "x""#, r#"Status == "x"#, "Status ==", "(Status == x", "Status is full", "== x"] {
            assert!(Filter::parse(bad).is_err(), "{bad}");
        }
    }

    /// The examples of Nomad's API documentation ("Filtering"): its two
    /// filtered lists, its two selector forms, and its precedence rule.
    #[test]
    fn nomads_documented_examples_hold() {
        let jobs = [
            json!({"ID": "countdash", "Datacenters": ["dc1", "dc2"], "Status": "pending"}),
            json!({"ID": "example", "Datacenters": ["dc1"], "Status": "running"}),
        ];
        let kept = |filter: &str, list: &[Value]| -> Vec<String> {
            let filter = Filter::parse(filter).expect("parses");
            list.iter().filter(|item| filter.matches(item)).map(|item| item["ID"].to_string()).collect()
        };
        assert_eq!(kept(r#"Datacenters contains "dc2""#, &jobs), [r#""countdash""#]);
        let deployments = [
            json!({"ID": "58fd0616", "Status": "cancelled", "TaskGroups": {"dashboard": {}, "api": {}}}),
            json!({"ID": "1f18b48c", "Status": "successful", "TaskGroups": {"cache": {"HealthyAllocs": 1}}}),
        ];
        assert_eq!(kept(r#"Status != "successful""#, &deployments), [r#""58fd0616""#]);
        for selector in ["TaskGroups.cache.HealthyAllocs == 1", r#"TaskGroups["cache"].HealthyAllocs == 1"#] {
            assert_eq!(kept(selector, &deployments), [r#""1f18b48c""#], "{selector}");
        }
        // `<E1> and not <E2> or <E3>` is `(<E1> and (not <E2>)) or <E3>`.
        let loose = Filter::parse("A == 1 and not B == 1 or C == 1").expect("parses");
        let grouped = Filter::parse("( A == 1 and (not B == 1 )) or C == 1").expect("parses");
        for bits in 0..8 {
            let object = json!({"A": bits & 1, "B": (bits >> 1) & 1, "C": (bits >> 2) & 1});
            assert_eq!(loose.matches(&object), grouped.matches(&object), "{object}");
        }
    }
}
