//! TPC-C consistency conditions 1-4 (clause 3.3.2), checked after a run on a quiet database:
//!
//! 1. `W_YTD` = sum of its districts' `D_YTD`;
//! 2. `D_NEXT_O_ID - 1` = max `O_ID` = max `NO_O_ID` of the district;
//! 3. max `NO_O_ID` - min `NO_O_ID` + 1 = number of new-order rows of the district;
//! 4. sum of the district's `O_OL_CNT` = number of its order-line rows.

use super::load::DISTRICTS;
use super::schema::*;
use shoal_btree::{BTree, Direction, TreeError};
use shoal_engine::Worker;

/// Rows of `tree` whose keys start with `prefix`, in key order, as (key, value).
fn each(
    w: &Worker,
    tree: &BTree,
    prefix: &[u8],
    mut f: impl FnMut(&[u8], &[u8]),
) -> Result<(), TreeError> {
    tree.scan(w, prefix, Direction::Ascending, |k, v| {
        if !k.starts_with(prefix) {
            return false;
        }
        f(k, v);
        true
    })
}

/// Check warehouse `wid`; returns the violations found (empty: consistent).
pub fn warehouse(w: &Worker, t: &Tables, wid: u16) -> Result<Vec<String>, TreeError> {
    let mut bad = Vec::new();
    let t_w = t.at(wid);
    let Some(wrow) = t_w.warehouse.get(w, warehouse_key(wid))? else {
        bad.push(format!("warehouse {wid} does not exist"));
        return Ok(bad);
    };
    if wrow.len() != warehouse::LEN {
        bad.push(format!(
            "warehouse {wid}: row of {} bytes, not a warehouse row",
            wrow.len()
        ));
        return Ok(bad);
    }
    let w_ytd = get_i64(&wrow, warehouse::YTD);
    let mut d_ytd = 0i64;
    for d in 1..=DISTRICTS {
        let Some(drow) = t_w.district.get(w, district_key(wid, d))? else {
            bad.push(format!("district {wid}/{d} does not exist"));
            continue;
        };
        if drow.len() != district::LEN {
            bad.push(format!(
                "district {wid}/{d}: row of {} bytes, not a district row",
                drow.len()
            ));
            continue;
        }
        d_ytd += get_i64(&drow, district::YTD);
        let next = get_u32(&drow, district::NEXT_O_ID);
        let prefix = district_key(wid, d);

        let (mut max_o, mut ol_cnt_sum, mut odd) = (0u32, 0u64, 0u64);
        each(w, &t_w.order, &prefix, |k, v| {
            max_o = max_o.max(key_tail_u32(k).unwrap_or(0));
            if v.len() == order::LEN {
                ol_cnt_sum += get_u32(v, order::OL_CNT) as u64;
            } else {
                odd += 1;
            }
        })?;
        if odd > 0 {
            bad.push(format!(
                "district {wid}/{d}: {odd} order rows of the wrong size"
            ));
        }
        let (mut no_min, mut no_max, mut no_count) = (u32::MAX, 0u32, 0u64);
        each(w, &t_w.new_order, &prefix, |k, _| {
            let o = key_tail_u32(k).unwrap_or(0);
            no_min = no_min.min(o);
            no_max = no_max.max(o);
            no_count += 1;
        })?;
        let mut lines = 0u64;
        each(w, &t_w.order_line, &prefix, |_, _| lines += 1)?;

        if next - 1 != max_o {
            bad.push(format!(
                "condition 2, district {wid}/{d}: D_NEXT_O_ID - 1 = {} but max O_ID = {max_o}",
                next - 1
            ));
        }
        if no_count > 0 && no_max != max_o {
            bad.push(format!(
                "condition 2, district {wid}/{d}: max NO_O_ID = {no_max} but max O_ID = {max_o}"
            ));
        }
        if no_count > 0 && (no_max - no_min + 1) as u64 != no_count {
            bad.push(format!(
                "condition 3, district {wid}/{d}: new orders {no_min}..={no_max} but {no_count} rows"
            ));
        }
        if ol_cnt_sum != lines {
            bad.push(format!(
                "condition 4, district {wid}/{d}: sum of O_OL_CNT = {ol_cnt_sum} but {lines} order lines"
            ));
        }
    }
    if w_ytd != d_ytd {
        bad.push(format!(
            "condition 1, warehouse {wid}: W_YTD = {w_ytd} cents but its districts' D_YTD sum to {d_ytd}"
        ));
    }
    Ok(bad)
}

#[cfg(test)]
mod tests {
    use super::super::load;
    use super::*;

    /// The population has the standard cardinalities and is consistent; each kind of damage
    /// the conditions are about is reported.
    #[test]
    fn population_is_consistent_and_damage_is_reported() {
        let l = load::testing::one_warehouse(5);
        let (e, t) = (&l.engine, l.tables);
        let w = e.worker();
        assert_eq!(t.item.count(&w).unwrap(), 100_000);
        assert_eq!(t.at(1).stock.count(&w).unwrap(), 100_000);
        assert_eq!(t.at(1).district.count(&w).unwrap(), 10);
        assert_eq!(t.at(1).customer.count(&w).unwrap(), 30_000);
        assert_eq!(t.at(1).customer_name.count(&w).unwrap(), 30_000);
        assert_eq!(t.at(1).history.count(&w).unwrap(), 30_000);
        assert_eq!(t.at(1).order.count(&w).unwrap(), 30_000);
        assert_eq!(t.at(1).new_order.count(&w).unwrap(), 9_000);
        let lines = t.at(1).order_line.count(&w).unwrap();
        assert!((150_000..=450_000).contains(&lines), "{lines}");
        assert!(warehouse(&w, &t, 1).unwrap().is_empty());
        assert_eq!(
            warehouse(&w, &t, 2).unwrap(),
            vec!["warehouse 2 does not exist"]
        );

        // 1: a district's YTD changes alone
        t.at(1)
            .district
            .update(&w, district_key(1, 3), |r| {
                set_i64(r, district::YTD, get_i64(r, district::YTD) + 1)
            })
            .unwrap();
        // 3: a new order in the middle of district 4's range disappears
        assert!(t.at(1).new_order.remove(&w, order_key(1, 4, 2500)).unwrap());
        // 2: district 5's next order id runs ahead of its orders
        t.at(1)
            .district
            .update(&w, district_key(1, 5), |r| {
                set_u32(r, district::NEXT_O_ID, get_u32(r, district::NEXT_O_ID) + 1)
            })
            .unwrap();
        // 4: an order line of district 6 disappears
        assert!(t
            .at(1)
            .order_line
            .remove(&w, order_line_key(1, 6, 7, 1))
            .unwrap());
        let bad = warehouse(&w, &t, 1).unwrap();
        let has = |s: &str| bad.iter().any(|b| b.starts_with(s));
        assert!(has("condition 1, warehouse 1"), "{bad:?}");
        assert!(has("condition 2, district 1/5"), "{bad:?}");
        assert!(has("condition 3, district 1/4"), "{bad:?}");
        assert!(has("condition 4, district 1/6"), "{bad:?}");
        assert_eq!(bad.len(), 4, "{bad:?}");
        // a row of the wrong size is reported, not read out of bounds
        t.at(1)
            .warehouse
            .upsert(&w, warehouse_key(1), b"odd")
            .unwrap();
        let bad = warehouse(&w, &t, 1).unwrap();
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(bad[0].contains("not a warehouse row"), "{bad:?}");
        drop(w);
        e.close().unwrap();
    }
}
