//! The `links` table (one row per slug: destination, owner, status, version) and the
//! `idempotency` claims that make a retried create return the link it made.

use crate::db::{all, applied, first, unavailable, Db, StoreError};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlTimestamp;
use scylla::DeserializeRow;
use std::sync::Arc;
use zlink_wire::domain::LinkKey;
use zlink_wire::LinkStatus;

const LINK_COLUMNS: &str =
    "slug, url, owner, status, redirect_code, created_at, expires_at, version, idem, disabled_by, \
     alias";

/// One link as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The `slug` column: `slug` or `<domain>/<slug>`.
    pub key: LinkKey,
    pub url: String,
    pub owner: String,
    pub status: LinkStatus,
    pub redirect_code: u16,
    pub created_at_ms: i64,
    pub expires_at_ms: Option<i64>,
    pub version: i64,
    /// Hash of (owner, Idempotency-Key) of the request that created the link.
    pub idem: Option<String>,
    /// Who disabled the link (see [`DisabledBy`]); `None` while it is active.
    pub disabled_by: Option<DisabledBy>,
    /// The owner's name for the link; not part of what a redirect answers.
    pub alias: Option<String>,
}

/// Who disabled a link. An admin's disable is a takedown: only an admin can undo it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisabledBy {
    pub admin: bool,
    pub key_id: String,
}

impl DisabledBy {
    /// Stored as `admin:<key id>` or `owner:<key id>`.
    pub fn to_column(&self) -> String {
        let role = if self.admin { "admin" } else { "owner" };
        format!("{role}:{}", self.key_id)
    }

    pub fn from_column(s: &str) -> Option<Self> {
        let (role, key_id) = s.split_once(':')?;
        let admin = match role {
            "admin" => true,
            "owner" => false,
            _ => return None,
        };
        Some(DisabledBy {
            admin,
            key_id: key_id.to_string(),
        })
    }
}

#[derive(DeserializeRow)]
struct LinkRow {
    slug: String,
    url: String,
    owner: String,
    status: String,
    redirect_code: i32,
    created_at: CqlTimestamp,
    expires_at: Option<CqlTimestamp>,
    version: i64,
    idem: Option<String>,
    disabled_by: Option<String>,
    alias: Option<String>,
}

impl TryFrom<LinkRow> for Link {
    type Error = StoreError;
    fn try_from(r: LinkRow) -> Result<Self, StoreError> {
        let status = r.status.parse().map_err(|_| {
            StoreError::Corrupt(format!("link {:?} has status {:?}", r.slug, r.status))
        })?;
        let redirect_code = u16::try_from(r.redirect_code)
            .ok()
            .filter(|c| zlink_wire::link::is_redirect_code(*c))
            .ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "link {:?} has redirect code {}",
                    r.slug, r.redirect_code
                ))
            })?;
        let disabled_by = match r.disabled_by.as_deref() {
            None | Some("") => None,
            Some(d) => Some(DisabledBy::from_column(d).ok_or_else(|| {
                StoreError::Corrupt(format!("link {:?} has disabled_by {d:?}", r.slug))
            })?),
        };
        Ok(Link {
            key: LinkKey::from(r.slug),
            url: r.url,
            owner: r.owner,
            status,
            redirect_code,
            created_at_ms: r.created_at.0,
            expires_at_ms: r.expires_at.map(|t| t.0),
            version: r.version,
            idem: r.idem,
            disabled_by,
            alias: r.alias,
        })
    }
}

/// A position in a token-range scan of `links`.
pub type ScanPage = scylla::response::PagingState;

pub struct Links {
    db: Arc<Db>,
    get: PreparedStatement,
    get_serial: PreparedStatement,
    insert: PreparedStatement,
    update_status: PreparedStatement,
    update_target: PreparedStatement,
    update_alias: PreparedStatement,
    claim_idem: PreparedStatement,
    get_idem_serial: PreparedStatement,
    scan: PreparedStatement,
    changed_at: PreparedStatement,
    index_add: PreparedStatement,
    index_month_add: PreparedStatement,
    index_months: PreparedStatement,
    index_first: PreparedStatement,
    index_after: PreparedStatement,
    /// (owner, month)s this process wrote to `owner_months`: written once, not per link.
    months_written: std::sync::Mutex<std::collections::HashSet<(String, i32)>>,
}

/// Entries of [`Links`]'s memo of `owner_months` rows written, before it starts over.
const MONTHS_MEMO: usize = 100_000;

/// A link's place in its owner's list: newest first, ties by slug (descending).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ListPosition {
    pub created_at_ms: i64,
    pub key: LinkKey,
}

/// Months since 1970-01 (UTC) of a time in milliseconds: the bucket of the owner index.
pub fn month_of_ms(ms: i64) -> i32 {
    crate::clicks::month_of_day(crate::clicks::day_of(ms))
}

impl Links {
    pub async fn prepare(db: Arc<Db>) -> Result<Self, StoreError> {
        let select = format!("SELECT {LINK_COLUMNS} FROM links WHERE slug = ?");
        let mut scan = db
            .prepare(
                format!(
                    "SELECT {LINK_COLUMNS} FROM links WHERE token(slug) >= ? AND token(slug) <= ?"
                ),
                true,
                false,
            )
            .await?;
        scan.set_page_size(500);
        Ok(Links {
            changed_at: db
                .prepare(
                    "SELECT WRITETIME(version) FROM links WHERE slug = ?",
                    true,
                    false,
                )
                .await?,
            get: db.prepare(select.clone(), true, false).await?,
            get_serial: db.prepare(select, true, true).await?,
            insert: db
                .prepare(
                    format!("INSERT INTO links ({LINK_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS"),
                    // May be sent twice (speculatively, see `db`): a copy that lost to the
                    // other finds this very row; the caller tells it from a taken slug by
                    // comparing that row with the link it wrote (`api::create`).
                    true,
                    false,
                )
                .await?,
            update_status: db
                .prepare(
                    "UPDATE links SET status = ?, version = ?, disabled_by = ? \
                     WHERE slug = ? IF status = ? AND version = ?",
                    false,
                    false,
                )
                .await?,
            update_target: db
                .prepare(
                    "UPDATE links SET url = ?, expires_at = ?, version = ? \
                     WHERE slug = ? IF status = ? AND version = ?",
                    false,
                    false,
                )
                .await?,
            update_alias: db
                .prepare(
                    "UPDATE links SET alias = ? WHERE slug = ? IF EXISTS",
                    false,
                    false,
                )
                .await?,
            claim_idem: db
                .prepare(
                    "INSERT INTO idempotency (owner, idem_key, slug, fingerprint, created_at) \
                     VALUES (?, ?, ?, ?, ?) IF NOT EXISTS",
                    // A copy that lost to the other reads this claim back as the winner: the
                    // same slug and fingerprint, so the create goes on as if it had won.
                    true,
                    false,
                )
                .await?,
            get_idem_serial: db
                .prepare(
                    "SELECT slug, fingerprint FROM idempotency WHERE owner = ? AND idem_key = ?",
                    true,
                    true,
                )
                .await?,
            scan,
            index_add: db
                .prepare(
                    "INSERT INTO links_by_owner (owner, month, created_at, slug) VALUES (?, ?, ?, ?)",
                    true,
                    false,
                )
                .await?,
            index_month_add: db
                .prepare(
                    "INSERT INTO owner_months (owner, month) VALUES (?, ?)",
                    true,
                    false,
                )
                .await?,
            index_months: db
                .prepare(
                    "SELECT month FROM owner_months WHERE owner = ?",
                    true,
                    false,
                )
                .await?,
            index_first: db
                .prepare(
                    "SELECT created_at, slug FROM links_by_owner \
                     WHERE owner = ? AND month = ? LIMIT ?",
                    true,
                    false,
                )
                .await?,
            months_written: Default::default(),
            index_after: db
                .prepare(
                    "SELECT created_at, slug FROM links_by_owner \
                     WHERE owner = ? AND month = ? AND (created_at, slug) < (?, ?) LIMIT ?",
                    true,
                    false,
                )
                .await?,
            db,
        })
    }

    /// Enters `link` in its owner's list. Written before the link itself (a crash in between
    /// leaves an entry without a link, which the list skips; never a link the list misses).
    /// A retried create adds an entry with another time for the same slug: the list keeps only
    /// the entry whose time is the link's.
    pub async fn index(&self, link: &Link) -> Result<(), StoreError> {
        let month = month_of_ms(link.created_at_ms);
        let key = (link.owner.clone(), month);
        let known = self.months_written.lock().is_ok_and(|m| m.contains(&key));
        if !known {
            self.db
                .exec(&self.index_month_add, (&link.owner, month))
                .await?;
            if let Ok(mut m) = self.months_written.lock() {
                if m.len() >= MONTHS_MEMO {
                    m.clear();
                }
                m.insert(key);
            }
        }
        self.db
            .exec(
                &self.index_add,
                (
                    &link.owner,
                    month,
                    CqlTimestamp(link.created_at_ms),
                    &link.key.as_str(),
                ),
            )
            .await?;
        Ok(())
    }

    /// The months (newest first) in which `owner` created links.
    pub async fn owner_months(&self, owner: &str) -> Result<Vec<i32>, StoreError> {
        let res = self.db.exec(&self.index_months, (owner,)).await?;
        let mut months: Vec<i32> = all::<(i32,)>(res)?.into_iter().map(|(m,)| m).collect();
        months.sort_unstable_by(|a, b| b.cmp(a));
        Ok(months)
    }

    /// Up to `limit` entries of `owner`'s list in `month`, newest first, after `after` (a
    /// position in that month) or from the month's newest.
    pub async fn owner_page(
        &self,
        owner: &str,
        month: i32,
        after: Option<&ListPosition>,
        limit: i32,
    ) -> Result<Vec<ListPosition>, StoreError> {
        let res = match after {
            Some(p) => {
                let values = (
                    owner,
                    month,
                    CqlTimestamp(p.created_at_ms),
                    p.key.as_str(),
                    limit,
                );
                self.db.exec(&self.index_after, values).await?
            }
            None => {
                self.db
                    .exec(&self.index_first, (owner, month, limit))
                    .await?
            }
        };
        Ok(all::<(CqlTimestamp, String)>(res)?
            .into_iter()
            .map(|(t, key)| ListPosition {
                created_at_ms: t.0,
                key: LinkKey::from(key),
            })
            .collect())
    }

    fn link_of(row: Option<LinkRow>) -> Result<Option<Link>, StoreError> {
        row.map(Link::try_from).transpose()
    }

    /// The redirect's read: within the read budget when the store is guarded.
    pub async fn get(&self, slug: &str) -> Result<Option<Link>, StoreError> {
        Self::link_of(first(self.db.read(&self.get, (slug,)).await?)?)
    }

    /// An API read (the list's): within the statement budget, not the redirect's read budget.
    pub async fn get_for_api(&self, slug: &str) -> Result<Option<Link>, StoreError> {
        Self::link_of(first(self.db.exec(&self.get, (slug,)).await?)?)
    }

    /// A linearizable read: sees the outcome of every LWT that completed before it.
    pub async fn get_serial(&self, slug: &str) -> Result<Option<Link>, StoreError> {
        Self::link_of(first(self.db.exec(&self.get_serial, (slug,)).await?)?)
    }

    /// Claims `link.slug`. Returns false if any link already has that slug.
    pub async fn insert_if_absent(&self, link: &Link) -> Result<bool, StoreError> {
        let values = (
            &link.key.as_str(),
            &link.url,
            &link.owner,
            link.status.as_str(),
            i32::from(link.redirect_code),
            CqlTimestamp(link.created_at_ms),
            link.expires_at_ms.map(CqlTimestamp),
            link.version,
            &link.idem,
            link.disabled_by.as_ref().map(DisabledBy::to_column),
            &link.alias,
        );
        applied(self.db.exec(&self.insert, values).await?)
    }

    /// Moves a link from (`from`, `version`) to (`to`, `version + 1`), recording who disabled
    /// it (`None` clears it). False if the link was not in exactly that state (changed
    /// concurrently, or never was).
    pub async fn transition(
        &self,
        slug: &str,
        from: LinkStatus,
        version: i64,
        to: LinkStatus,
        disabled_by: Option<&DisabledBy>,
    ) -> Result<bool, StoreError> {
        let values = (
            to.as_str(),
            version + 1,
            disabled_by.map(DisabledBy::to_column),
            slug,
            from.as_str(),
            version,
        );
        applied(self.db.exec(&self.update_status, values).await?)
    }

    /// Gives the link at (`status`, `version`) a new destination and expiry as `version + 1`.
    /// False if the link was not in exactly that state.
    pub async fn retarget(
        &self,
        slug: &str,
        status: LinkStatus,
        version: i64,
        url: &str,
        expires_at_ms: Option<i64>,
    ) -> Result<bool, StoreError> {
        let values = (
            url,
            expires_at_ms.map(CqlTimestamp),
            version + 1,
            slug,
            status.as_str(),
            version,
        );
        applied(self.db.exec(&self.update_target, values).await?)
    }

    /// Sets (or with `None` clears) a link's alias. Not a new version: no tier serves it.
    pub async fn set_alias(&self, slug: &str, alias: Option<&str>) -> Result<bool, StoreError> {
        applied(self.db.exec(&self.update_alias, (alias, slug)).await?)
    }

    /// Claims an idempotency key for `slug`. On a lost claim returns the winner's (slug, fingerprint).
    pub async fn claim_idempotency(
        &self,
        owner: &str,
        key: &str,
        slug: &str,
        fingerprint: &str,
        now_ms: i64,
    ) -> Result<Option<(String, String)>, StoreError> {
        let values = (owner, key, slug, fingerprint, CqlTimestamp(now_ms));
        if applied(self.db.exec(&self.claim_idem, values).await?)? {
            return Ok(None);
        }
        let res = self.db.exec(&self.get_idem_serial, (owner, key)).await?;
        match first::<(String, String)>(res)? {
            Some(winner) => Ok(Some(winner)),
            // Lost the claim but the row is gone: it expired in between. Extremely unlikely.
            None => Err(StoreError::Contention(
                "idempotency key expired while being claimed",
            )),
        }
    }

    /// When the link's current version was written (its last change), in Unix milliseconds.
    pub async fn changed_at_ms(&self, slug: &str) -> Result<Option<i64>, StoreError> {
        let row = first::<(Option<i64>,)>(self.db.exec(&self.changed_at, (slug,)).await?)?;
        Ok(row.and_then(|(micros,)| micros).map(|us| us / 1000))
    }

    /// One page (≤ 500 links) of the links whose partition token lies in `[from, to]`, and the
    /// position of the next page if there is one. Memory stays bounded by the page size.
    pub async fn scan(
        &self,
        from: i64,
        to: i64,
        page: ScanPage,
    ) -> Result<(Vec<Link>, Option<ScanPage>), StoreError> {
        let (res, next) = self
            .db
            .session()
            .execute_single_page(&self.scan, (from, to), page)
            .await
            .map_err(unavailable)?;
        let links = all::<LinkRow>(res)?
            .into_iter()
            .map(Link::try_from)
            .collect::<Result<Vec<_>, _>>()?;
        let next = match next.into_paging_control_flow() {
            std::ops::ControlFlow::Continue(p) => Some(p),
            std::ops::ControlFlow::Break(()) => None,
        };
        Ok((links, next))
    }
}
