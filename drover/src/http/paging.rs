//! Lists that scale (Nomad 1.3+'s `?per_page=`, `?next_token=` and
//! `?filter=`), the same for every list: jobs, allocations, evaluations,
//! nodes, deployments, services (their namespaces) and a service's
//! registrations.
//!
//! 1. A list has an order given by a key unique per item ([`PageKey`]);
//!    a token is a key written as text.
//! 2. A page starts at the first item whose key is at or after the
//!    token. An item written or removed between two pages moves no other
//!    item, so paging through a list while it changes returns every item
//!    present throughout exactly once, and none twice.
//! 3. Items are answered one at a time from there (built, and with a
//!    filter matched against the answer as Nomad's JSON) until the page
//!    is full and one more matches: that one's key is the
//!    `X-Nomad-NextToken`, absent on the last page. Only the page's
//!    answers are ever held, never the whole list's: the candidates are
//!    references into the snapshot, sorted by key.

use std::cmp::Reverse;

use serde::Serialize;

use super::error::ApiError;
use super::filter::Filter;
use super::query::Params;

/// A list's order, and its token.
pub trait PageKey: Ord + Sized {
    /// The key a token names; `None` when it names none.
    fn parse(token: &str) -> Option<Self>;
    /// The key written as a token.
    fn token(&self) -> String;
}

/// Newest first, then by id: evaluations, allocations, deployments. The
/// token is `<CreateIndex>.<ID>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct NewestFirst(pub Reverse<u64>, pub uuid::Uuid);

impl NewestFirst {
    /// The key of an object created at `create_index` with `id`.
    pub fn of(create_index: u64, id: uuid::Uuid) -> NewestFirst {
        NewestFirst(Reverse(create_index), id)
    }
}

impl PageKey for NewestFirst {
    fn parse(token: &str) -> Option<Self> {
        let (index, id) = token.split_once('.')?;
        Some(NewestFirst(Reverse(index.parse().ok()?), uuid::Uuid::parse_str(id).ok()?))
    }

    fn token(&self) -> String {
        format!("{}.{}", self.0 .0, self.1)
    }
}

/// By id: nodes. The token is the id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ById(pub uuid::Uuid);

impl PageKey for ById {
    fn parse(token: &str) -> Option<Self> {
        uuid::Uuid::parse_str(token).ok().map(ById)
    }

    fn token(&self) -> String {
        self.0.to_string()
    }
}

/// By name: namespaces (the services list). The token is the name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByName(pub String);

impl PageKey for ByName {
    fn parse(token: &str) -> Option<Self> {
        Some(ByName(token.to_string()))
    }

    fn token(&self) -> String {
        self.0.clone()
    }
}

/// By namespace, then id: jobs, service registrations. The token is `<Namespace>.<ID>` (a
/// namespace's name has no dot).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByNamespacedId(pub String, pub String);

impl PageKey for ByNamespacedId {
    fn parse(token: &str) -> Option<Self> {
        let (namespace, id) = token.split_once('.')?;
        Some(ByNamespacedId(namespace.to_string(), id.to_string()))
    }

    fn token(&self) -> String {
        format!("{}.{}", self.0, self.1)
    }
}

/// What a list request asks of its page.
#[derive(Debug, Default)]
pub struct PageQuery {
    per_page: Option<usize>,
    next_token: Option<String>,
    filter: Option<Filter>,
}

impl PageQuery {
    /// A query for pages of `per_page` (none or 0: one page of
    /// everything, as Nomad) from `next_token`, of the items `filter`
    /// matches.
    pub fn new(per_page: Option<usize>, next_token: Option<String>, filter: Option<Filter>) -> PageQuery {
        PageQuery { per_page: per_page.filter(|size| *size > 0), next_token, filter }
    }

    /// `per_page`, `next_token` and `filter` of `params`; a malformed one
    /// is refused with Nomad's message.
    pub fn of(params: &Params) -> Result<PageQuery, ApiError> {
        Ok(PageQuery::new(params.per_page()?, params.next_token().map(str::to_string), params.filter()?))
    }

    /// The page of `items` (any order) this query names: the answers, and
    /// the next page's token (module docs).
    pub fn page<T, K: PageKey, A: Serialize>(
        &self,
        mut items: Vec<T>,
        key: impl Fn(&T) -> K,
        answer: impl Fn(&T) -> A,
    ) -> Result<(Vec<A>, Option<String>), ApiError> {
        items.sort_by_cached_key(|item| key(item));
        let from = match &self.next_token {
            None => 0,
            Some(token) => {
                let start = K::parse(token).ok_or_else(|| {
                    ApiError::BadRequest(format!("failed to read result page: invalid next_token {token:?}"))
                })?;
                items.partition_point(|item| key(item) < start)
            }
        };
        let mut page = Vec::new();
        for item in &items[from..] {
            let answered = answer(item);
            if let Some(filter) = &self.filter {
                let json = serde_json::to_value(&answered)
                    .map_err(|error| ApiError::Internal(format!("failed to read result page: {error}")))?;
                if !filter.matches(&json) {
                    continue;
                }
            }
            if self.per_page.is_some_and(|size| page.len() == size) {
                return Ok((page, Some(key(item).token())));
            }
            page.push(answered);
        }
        Ok((page, None))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    fn query(per_page: usize, next_token: Option<String>, filter: Option<&str>) -> PageQuery {
        PageQuery::new(Some(per_page), next_token, filter.map(|text| Filter::parse(text).expect("a filter")))
    }

    fn key(n: &u64) -> NewestFirst {
        NewestFirst::of(*n / 3, uuid::Uuid::from_u128(u128::from(*n)))
    }

    proptest! {
        /// Paging through a list that changes between pages returns
        /// every item present throughout exactly once, and none twice.
        #[test]
        fn every_item_present_throughout_is_returned_exactly_once(
            initial in proptest::collection::btree_set(0u64..400, 0..120),
            per_page in 1usize..20,
            changes in proptest::collection::vec((any::<bool>(), 0u64..400), 0..60),
        ) {
            let mut current = initial.clone();
            let mut throughout = initial;
            let mut returned = Vec::new();
            let mut token = None;
            let mut changes = changes.into_iter();
            loop {
                let items: Vec<u64> = current.iter().copied().collect();
                let (page, next) = query(per_page, token, None).page(items, key, |n| *n).expect("a page");
                prop_assert!(page.len() <= per_page);
                returned.extend(page);
                let Some(next) = next else { break };
                token = Some(next);
                // Writes between pages: an item created or removed.
                for (insert, n) in changes.by_ref().take(3) {
                    if insert { current.insert(n); } else { current.remove(&n); throughout.remove(&n); }
                }
            }
            let unique: BTreeSet<u64> = returned.iter().copied().collect();
            prop_assert_eq!(unique.len(), returned.len(), "none twice");
            prop_assert!(throughout.is_subset(&unique), "every item present throughout");
        }
    }

    #[test]
    fn a_filter_pages_through_the_matches_only() {
        let items: Vec<u64> = (0..100).collect();
        let even = Some("Odd == false");
        let answer = |n: &u64| serde_json::json!({"N": n, "Odd": n % 2 == 1});
        let (first, next) = query(3, None, even).page(items.clone(), key, answer).expect("a page");
        let numbers: Vec<u64> = first.iter().map(|json| json["N"].as_u64().expect("n")).collect();
        // Newest first (99 is of index 33; 96, 97 and 98 of 32, by id), the even ones.
        assert_eq!(numbers, vec![96, 98, 94]);
        let next = next.expect("more");
        assert_eq!(next, key(&90).token(), "the next match names the next page");
        let (second, _) = query(3, Some(next), even).page(items, key, answer).expect("a page");
        assert_eq!(second[0]["N"], 90);
    }

    #[test]
    fn a_token_that_names_no_key_is_refused() {
        let refused = query(3, Some("not-a-token".to_string()), None).page(vec![1u64], key, |n| *n);
        assert!(matches!(refused, Err(ApiError::BadRequest(message)) if message.contains("next_token")));
    }
}
