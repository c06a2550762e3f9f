//! The figures kpr-bench measured, printed as a markdown table or JSON.

use super::*;

/// One measured figure.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Row {
    pub(super) bench: &'static str,
    pub(super) services: usize,
    pub(super) metric: String,
    pub(super) value: f64,
    pub(super) unit: &'static str,
    /// The target, if it has one: (text, met).
    pub(super) target: Option<String>,
    pub(super) met: Option<bool>,
}

pub(super) struct Report {
    pub(super) rows: Vec<Row>,
}

impl Report {
    pub(super) fn add(&mut self, bench: &'static str, services: usize, metric: &str, value: f64, unit: &'static str) {
        self.rows.push(Row { bench, services, metric: metric.into(), value, unit, target: None, met: None });
    }

    /// A figure with a target: met when `value < limit`.
    pub(super) fn target(
        &mut self,
        bench: &'static str,
        services: usize,
        metric: &str,
        value: f64,
        unit: &'static str,
        limit: f64,
    ) {
        self.rows.push(Row {
            bench,
            services,
            metric: metric.into(),
            value,
            unit,
            target: Some(format!("< {limit} {unit}")),
            met: Some(value < limit),
        });
    }

    pub(super) fn print(&self, json: bool) {
        if json {
            match serde_json::to_string_pretty(&self.rows) {
                Ok(s) => println!("{s}"),
                Err(e) => eprintln!("kpr-bench: {e}"),
            }
            return;
        }
        println!("| bench | services | metric | value | target |");
        println!("|---|---:|---|---:|---|");
        for r in &self.rows {
            let target = match (&r.target, r.met) {
                (Some(t), Some(true)) => format!("{t} ✅"),
                (Some(t), _) => format!("{t} ❌"),
                _ => String::new(),
            };
            let value = if r.value.fract() == 0.0 && r.value.abs() < 1e12 {
                format!("{} {}", r.value, r.unit)
            } else {
                format!("{:.3} {}", r.value, r.unit)
            };
            println!("| {} | {} | {} | {} | {} |", r.bench, r.services, r.metric, value, target);
        }
    }
}

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub(super) fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
