//! Renders an nginx template from `nginx/` (the one source of truth) into a runnable config:
//! every `{{NAME}}` is replaced by its value; a placeholder left unfilled or a value given for
//! no placeholder is an error, so a template change cannot silently go unrendered. Defaults
//! come from `<template without .conf>.budgets` next to the template (`NAME=VALUE` lines, `#`
//! comments): the timeouts of the budget table, in one place; given values override them.

use anyhow::{bail, Context, Result};
use regex::Regex;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn is_name(s: &str) -> bool {
    let mut b = s.bytes();
    b.next().is_some_and(|c| c.is_ascii_uppercase())
        && b.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_')
}

/// `NAME=VALUE` arguments.
pub fn parse_values(args: &[String]) -> Result<Vec<(String, String)>> {
    args.iter()
        .map(|a| match a.split_once('=') {
            Some((n, v)) if is_name(n) => Ok((n.to_string(), v.to_string())),
            _ => bail!("bad argument {a:?} (want NAME=VALUE)"),
        })
        .collect()
}

/// The template's text with every placeholder filled.
pub fn render(template: &Path, values: &[(String, String)]) -> Result<String> {
    let mut all = BTreeMap::new();
    let budgets = template.with_extension("budgets");
    if budgets.exists() {
        let text = std::fs::read_to_string(&budgets)
            .with_context(|| format!("reading {}", budgets.display()))?;
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (n, v) = line.split_once('=').unwrap_or((line, ""));
            all.insert(n.trim().to_string(), v.trim().to_string());
        }
    }
    for (n, v) in values {
        all.insert(n.clone(), v.clone());
    }
    let mut text = std::fs::read_to_string(template)
        .with_context(|| format!("reading {}", template.display()))?;
    let wanted: BTreeSet<String> = Regex::new(r"\{\{([A-Z][A-Z0-9_]*)\}\}")
        .expect("regex")
        .captures_iter(&text)
        .map(|c| c[1].to_string())
        .collect();
    let given: BTreeSet<String> = all.keys().cloned().collect();
    let missing: Vec<_> = wanted.difference(&given).collect();
    let unused: Vec<_> = given.difference(&wanted).collect();
    if !missing.is_empty() || !unused.is_empty() {
        bail!(
            "{}: missing {missing:?}, unused {unused:?}",
            template.display()
        );
    }
    for (n, v) in &all {
        if v.contains(['{', '}']) {
            bail!("{n} must not contain braces");
        }
        text = text.replace(&format!("{{{{{n}}}}}"), v);
    }
    Ok(text)
}

/// Renders into `out` atomically (a temporary file renamed over it).
pub fn render_to(template: &Path, out: &Path, values: &[(String, String)]) -> Result<()> {
    let text = render(template, values)?;
    let tmp = out.with_extension("conf.tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, out).with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_every_placeholder_from_budgets_and_arguments_and_refuses_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("x.conf");
        std::fs::write(&t, "listen {{LISTEN}}; timeout {{T}}; again {{LISTEN}};").unwrap();
        std::fs::write(dir.path().join("x.budgets"), "# c\nT=5s\n").unwrap();
        let v = parse_values(&["LISTEN=1.2.3.4:5".into()]).unwrap();
        assert_eq!(
            render(&t, &v).unwrap(),
            "listen 1.2.3.4:5; timeout 5s; again 1.2.3.4:5;"
        );
        let over = parse_values(&["LISTEN=a".into(), "T=1s".into()]).unwrap();
        assert_eq!(render(&t, &over).unwrap(), "listen a; timeout 1s; again a;");
        assert!(render(&t, &[]).is_err(), "missing LISTEN");
        let extra = parse_values(&["LISTEN=a".into(), "OTHER=b".into()]).unwrap();
        assert!(render(&t, &extra).is_err(), "unused OTHER");
        let braces = parse_values(&["LISTEN={{T}}".into()]).unwrap();
        assert!(render(&t, &braces).is_err());
        assert!(parse_values(&["lower=x".into()]).is_err());
        assert!(parse_values(&["NOVALUE".into()]).is_err());
    }
}
