//! Branded domains: `domains` by name (what a create on a domain reads) and `domains_by_owner`
//! (an owner's list). A name is claimed once with `INSERT … IF NOT EXISTS`; approval moves it
//! PENDING → ACTIVE with `UPDATE … IF status = 'PENDING'`.

use crate::db::{all, applied, first, Db, StoreError};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlTimestamp;
use std::sync::Arc;

/// Whether a domain's links may be created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DomainStatus {
    /// Registered by an owner, waiting for an admin.
    Pending,
    /// Links may be created on it.
    Active,
}

impl DomainStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DomainStatus::Pending => "PENDING",
            DomainStatus::Active => "ACTIVE",
        }
    }

    fn parse(s: &str) -> Result<Self, StoreError> {
        match s {
            "PENDING" => Ok(DomainStatus::Pending),
            "ACTIVE" => Ok(DomainStatus::Active),
            other => Err(StoreError::Corrupt(format!("domain status {other:?}"))),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    /// Normalised ([`zlink_wire::domain::normalize`]).
    pub domain: String,
    pub owner: String,
    pub status: DomainStatus,
    pub created_at_ms: i64,
    /// Key id of the admin who approved it (or registered it), if an admin did.
    pub approved_by: Option<String>,
}

pub struct Domains {
    db: Arc<Db>,
    get: PreparedStatement,
    get_serial: PreparedStatement,
    insert: PreparedStatement,
    approve: PreparedStatement,
    index_add: PreparedStatement,
    index_list: PreparedStatement,
}

const COLUMNS: &str = "domain, owner, status, created_at, approved_by";

impl Domains {
    pub async fn prepare(db: Arc<Db>) -> Result<Self, StoreError> {
        let select = format!("SELECT {COLUMNS} FROM domains WHERE domain = ?");
        Ok(Domains {
            get: db.prepare(select.clone(), true, false).await?,
            get_serial: db.prepare(select, true, true).await?,
            insert: db
                .prepare(
                    format!("INSERT INTO domains ({COLUMNS}) VALUES (?, ?, ?, ?, ?) IF NOT EXISTS"),
                    false,
                    false,
                )
                .await?,
            approve: db
                .prepare(
                    "UPDATE domains SET status = 'ACTIVE', approved_by = ? \
                     WHERE domain = ? IF status = 'PENDING'",
                    false,
                    false,
                )
                .await?,
            index_add: db
                .prepare(
                    "INSERT INTO domains_by_owner (owner, domain) VALUES (?, ?)",
                    true,
                    false,
                )
                .await?,
            index_list: db
                .prepare(
                    "SELECT domain FROM domains_by_owner WHERE owner = ? LIMIT 1000",
                    true,
                    false,
                )
                .await?,
            db,
        })
    }

    fn domain_of(
        row: Option<(String, String, String, CqlTimestamp, Option<String>)>,
    ) -> Result<Option<Domain>, StoreError> {
        row.map(|(domain, owner, status, created, approved_by)| {
            Ok(Domain {
                domain,
                owner,
                status: DomainStatus::parse(&status)?,
                created_at_ms: created.0,
                approved_by,
            })
        })
        .transpose()
    }

    pub async fn get(&self, domain: &str) -> Result<Option<Domain>, StoreError> {
        Self::domain_of(first(self.db.exec(&self.get, (domain,)).await?)?)
    }

    /// Claims `d.domain` for `d.owner`. The owner's index is written first, so a list never
    /// misses a domain that exists (an index entry whose domain is someone else's is skipped).
    /// Returns the domain as stored: `d` if this claim won, else the existing registration.
    pub async fn claim(&self, d: &Domain) -> Result<(Domain, bool), StoreError> {
        self.db.exec(&self.index_add, (&d.owner, &d.domain)).await?;
        let values = (
            &d.domain,
            &d.owner,
            d.status.as_str(),
            CqlTimestamp(d.created_at_ms),
            &d.approved_by,
        );
        if applied(self.db.exec(&self.insert, values).await?)? {
            return Ok((d.clone(), true));
        }
        let existing =
            Self::domain_of(first(self.db.exec(&self.get_serial, (&d.domain,)).await?)?)?
                .ok_or_else(|| {
                    StoreError::Corrupt(format!("domain {:?} claimed but unreadable", d.domain))
                })?;
        Ok((existing, false))
    }

    /// PENDING → ACTIVE by the admin `by`; false if it was not pending.
    pub async fn approve(&self, domain: &str, by: &str) -> Result<bool, StoreError> {
        applied(self.db.exec(&self.approve, (by, domain)).await?)
    }

    /// The domains `owner` registered (at most 1,000), by name.
    pub async fn of_owner(&self, owner: &str) -> Result<Vec<Domain>, StoreError> {
        let names: Vec<(String,)> = all(self.db.exec(&self.index_list, (owner,)).await?)?;
        let mut out = Vec::with_capacity(names.len());
        for (name,) in names {
            if let Some(d) = self.get(&name).await? {
                if d.owner == owner {
                    out.push(d);
                }
            }
        }
        Ok(out)
    }
}
