//! The embedded, durable fence: a key-value table and the fence records in one redb database.
//!
//! A write is one redb write transaction: read the fence records of the resources it touches,
//! run the rule, and only if it admits, store the new records and the data, then commit. redb's
//! default durability fsyncs before `commit` returns, so the highest token is on disk before the
//! write is acknowledged and survives a crash or restart of the resource.

use crate::clock::WallClock;
use crate::guarded::Written;
use crate::refusal::Refusal;
use crate::rule::{self, FenceRecord, Policy, Presented};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::path::Path;
use thiserror::Error;

const FENCES: TableDefinition<&str, &[u8]> = TableDefinition::new("picket_fences");
const DATA: TableDefinition<&str, &[u8]> = TableDefinition::new("picket_data");

/// Longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 1_024;
/// Longest value, in bytes.
pub const MAX_VALUE_BYTES: usize = 1 << 20;
/// Most keys one listing returns.
pub const MAX_SCAN: usize = 1_000;

/// The storage failed: the write may or may not have been applied only if this came from the
/// commit itself; in every other case nothing was changed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// redb failed.
    #[error("the fence's storage failed: {0}; check the disk and the data directory's permissions")]
    Storage(#[from] redb::Error),
    /// A stored fence record does not decode.
    #[error(
        "the fence record of {resource:?} is damaged ({detail}); restore the data directory from a backup, then, before taking writes, register each guarded lock's current grant (fence on acquire: `POST /fence/{{prefix}}` with its sequencer in picket kv), since a backup's highest tokens may be older than the ones this store had admitted; or keep verification with the lock service on, which refuses grants that are no longer current"
    )]
    Corrupt {
        /// The resource.
        resource: String,
        /// What the decoder said.
        detail: String,
    },
    /// A key or value is over its limit.
    #[error("{what} is {len_bytes} bytes, over the limit of {max_bytes}")]
    TooLarge {
        /// What was too large.
        what: &'static str,
        /// Its size.
        len_bytes: usize,
        /// The limit.
        max_bytes: usize,
    },
}

fn storage(error: impl Into<redb::Error>) -> StoreError {
    StoreError::Storage(error.into())
}

/// Why a fenced write did not land.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The fence refused it; nothing was changed.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A resource a write touches and how it is guarded.
#[derive(Clone, Copy, Debug)]
pub struct ResourceGuard<'a> {
    /// The resource name, e.g. the key prefix a lock protects.
    pub resource: &'a str,
    /// Its lock and mode; stored with the first admitted write.
    pub policy: &'a Policy,
}

/// The data changes of one admitted write, applied in its transaction.
pub struct Unit<'t> {
    table: redb::Table<'t, &'static str, &'static [u8]>,
}

impl std::fmt::Debug for Unit<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Unit")
    }
}

impl Unit<'_> {
    /// Sets `key` to `value`.
    ///
    /// # Errors
    /// [`StoreError`] if the key or value is too large or the store fails.
    pub fn put(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        check_key(key)?;
        if value.len() > MAX_VALUE_BYTES {
            return Err(StoreError::TooLarge {
                what: "the value",
                len_bytes: value.len(),
                max_bytes: MAX_VALUE_BYTES,
            });
        }
        self.table.insert(key, value).map_err(storage)?;
        Ok(())
    }

    /// Removes `key`; returns whether it existed.
    ///
    /// # Errors
    /// [`StoreError`] if the store fails.
    pub fn delete(&mut self, key: &str) -> Result<bool, StoreError> {
        check_key(key)?;
        Ok(self.table.remove(key).map_err(storage)?.is_some())
    }

    /// Reads `key` as this transaction sees it.
    ///
    /// # Errors
    /// [`StoreError`] if the store fails.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        check_key(key)?;
        Ok(self.table.get(key).map_err(storage)?.map(|value| value.value().to_vec()))
    }
}

fn check_key(key: &str) -> Result<(), StoreError> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(StoreError::TooLarge {
            what: "the key",
            len_bytes: key.len(),
            max_bytes: MAX_KEY_BYTES,
        });
    }
    Ok(())
}

/// A durable fenced key-value store. See the module documentation.
#[derive(Debug)]
pub struct FencedStore {
    db: Database,
    clock: WallClock,
}

impl FencedStore {
    /// Opens (or creates) the store in the file at `path`.
    ///
    /// # Errors
    /// [`StoreError`] when the file cannot be opened or created.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let db = Database::create(path).map_err(storage)?;
        let txn = db.begin_write().map_err(storage)?;
        txn.open_table(FENCES).map_err(storage)?;
        txn.open_table(DATA).map_err(storage)?;
        txn.commit().map_err(storage)?;
        Ok(Self { db, clock: WallClock::system() })
    }

    /// The same store reading the time it gives the rule from `clock` (the system's wall clock
    /// unless told otherwise).
    #[must_use]
    pub fn with_clock(mut self, clock: WallClock) -> Self {
        self.clock = clock;
        self
    }

    /// Admits `presented` at every guard or at none, and if admitted runs `unit` and stores its
    /// changes with the new fence records in one durable transaction.
    ///
    /// If `unit` returns an error, nothing is stored, not even the fence records.
    ///
    /// # Errors
    /// [`WriteError::Refused`] when the fence refuses; [`WriteError::Store`] when storage fails
    /// or `unit` does.
    pub fn write<R>(
        &self,
        guards: &[ResourceGuard<'_>],
        presented: &Presented,
        unit: impl FnOnce(&mut Unit<'_>) -> Result<R, StoreError>,
    ) -> Result<Written<R>, WriteError> {
        let txn = self.db.begin_write().map_err(storage)?;
        let output;
        let admission;
        {
            let mut fences = txn.open_table(FENCES).map_err(storage)?;
            let current = guards
                .iter()
                .map(|guard| read_record(&fences, guard.resource))
                .collect::<Result<Vec<_>, _>>()?;
            let inputs: Vec<(&str, Option<&FenceRecord>, &Policy)> = guards
                .iter()
                .zip(&current)
                .map(|(guard, record)| (guard.resource, record.as_ref(), guard.policy))
                .collect();
            let (decided, records) = rule::admit_all(&inputs, presented, self.clock.now_ms())?;
            admission = decided;
            if !admission.should_apply() {
                return Ok(Written { admission, output: None });
            }
            // A record the admission left as it was (the same grant writing again, with no seq
            // or idempotency key to remember) is not rewritten: the commit then touches only
            // the data's pages, which is most of the fence's cost on the hot path.
            for ((guard, record), before) in guards.iter().zip(&records).zip(&current) {
                if before.as_ref() != Some(record) {
                    write_record(&mut fences, guard.resource, record)?;
                }
            }
            let table = txn.open_table(DATA).map_err(storage)?;
            let mut unit_handle = Unit { table };
            output = unit(&mut unit_handle)?;
        }
        txn.commit().map_err(storage)?;
        Ok(Written { admission, output: Some(output) })
    }

    /// Fence on acquire: makes `token` the highest for the resource, durably.
    ///
    /// # Errors
    /// [`WriteError::Refused`] when the token is stale or of another lock.
    pub fn register(
        &self,
        guard: ResourceGuard<'_>,
        lock: &str,
        token: u64,
    ) -> Result<(), WriteError> {
        let txn = self.db.begin_write().map_err(storage)?;
        {
            let mut fences = txn.open_table(FENCES).map_err(storage)?;
            let current = read_record(&fences, guard.resource)?;
            let record =
                rule::register(guard.resource, current.as_ref(), guard.policy, lock, token)?;
            if current.as_ref() == Some(&record) {
                return Ok(());
            }
            write_record(&mut fences, guard.resource, &record)?;
        }
        txn.commit().map_err(storage)?;
        Ok(())
    }

    /// The fence record of a resource, if anything was admitted or registered for it.
    ///
    /// # Errors
    /// [`StoreError`] if the store fails or the record is damaged.
    pub fn record(&self, resource: &str) -> Result<Option<FenceRecord>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let fences = txn.open_table(FENCES).map_err(storage)?;
        read_record(&fences, resource)
    }

    /// Reads `key` without a stamp.
    ///
    /// # Errors
    /// [`StoreError`] if the store fails.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        check_key(key)?;
        let txn = self.db.begin_read().map_err(storage)?;
        let data = txn.open_table(DATA).map_err(storage)?;
        Ok(data.get(key).map_err(storage)?.map(|value| value.value().to_vec()))
    }

    /// Reads `key` on behalf of a holder: refused if its token is stale for the guard, so a
    /// paused holder learns it was superseded before it acts on what it read. The check and the
    /// read see one snapshot.
    ///
    /// # Errors
    /// [`WriteError::Refused`] for a stale token; [`WriteError::Store`] if the store fails.
    pub fn get_checked(
        &self,
        guard: ResourceGuard<'_>,
        lock: &str,
        token: u64,
        key: &str,
    ) -> Result<Option<Vec<u8>>, WriteError> {
        check_key(key)?;
        let txn = self.db.begin_read().map_err(storage)?;
        let fences = txn.open_table(FENCES).map_err(storage)?;
        let record = read_record(&fences, guard.resource)?;
        rule::check_read(guard.resource, record.as_ref(), guard.policy, lock, token)?;
        let data = txn.open_table(DATA).map_err(storage)?;
        Ok(data.get(key).map_err(storage)?.map(|value| value.value().to_vec()))
    }

    /// Keys starting with `prefix`, in order, at most `limit` (and never more than
    /// [`MAX_SCAN`]).
    ///
    /// # Errors
    /// [`StoreError`] if the store fails.
    pub fn scan(&self, prefix: &str, limit: usize) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let data = txn.open_table(DATA).map_err(storage)?;
        let mut entries = Vec::new();
        for entry in data.range(prefix..).map_err(storage)? {
            let (key, value) = entry.map_err(storage)?;
            if !key.value().starts_with(prefix) || entries.len() >= limit.min(MAX_SCAN) {
                break;
            }
            entries.push((key.value().to_owned(), value.value().to_vec()));
        }
        Ok(entries)
    }
}

fn read_record(
    fences: &impl ReadableTable<&'static str, &'static [u8]>,
    resource: &str,
) -> Result<Option<FenceRecord>, StoreError> {
    let Some(bytes) = fences.get(resource).map_err(storage)? else { return Ok(None) };
    serde_json::from_slice(bytes.value()).map(Some).map_err(|error| StoreError::Corrupt {
        resource: resource.to_owned(),
        detail: error.to_string(),
    })
}

fn write_record(
    fences: &mut redb::Table<'_, &'static str, &'static [u8]>,
    resource: &str,
    record: &FenceRecord,
) -> Result<(), StoreError> {
    let bytes = serde_json::to_vec(record).expect("a fence record always serializes");
    fences.insert(resource, bytes.as_slice()).map_err(storage)?;
    Ok(())
}
