//! Parity: XOR for RAIF4 and RAIF5, Reed-Solomon (two recovery shards,
//! through reed-solomon-simd) for RAIF6. A stripe's units are given in
//! stripe order: the `k` data units, then the parity units.

use crate::level::Level;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("{missing} units of a {level} stripe are lost; it survives {tolerated}")]
    TooManyLost {
        level: Level,
        missing: usize,
        tolerated: usize,
    },
    #[error("Reed-Solomon: {0}")]
    ReedSolomon(String),
}

/// XORs `src` into `acc` (same lengths).
pub fn xor_into(acc: &mut [u8], src: &[u8]) {
    debug_assert_eq!(acc.len(), src.len());
    for (a, s) in acc.iter_mut().zip(src) {
        *a ^= s;
    }
}

/// The parity units of a stripe with data units `data` (all one length).
pub fn parity(level: Level, data: &[&[u8]]) -> Result<Vec<Vec<u8>>, CodecError> {
    match level {
        Level::Raif4 | Level::Raif5 => {
            let mut p = vec![0u8; data.first().map_or(0, |d| d.len())];
            for unit in data {
                xor_into(&mut p, unit);
            }
            Ok(vec![p])
        }
        Level::Raif6 => reed_solomon_simd::encode(data.len(), 2, data)
            .map_err(|e| CodecError::ReedSolomon(e.to_string())),
        Level::Raif0 | Level::Raif1 | Level::Raif10 => Ok(vec![]),
    }
}

/// Fills in the missing units (`None`) of a parity stripe: `units` holds
/// `k` data units then the level's parity units. Fails if more are
/// missing than the level survives.
pub fn recover(level: Level, units: &mut [Option<Vec<u8>>]) -> Result<(), CodecError> {
    let parity_count = level.parity_units();
    let k = units.len() - parity_count;
    let missing: Vec<usize> = (0..units.len()).filter(|&i| units[i].is_none()).collect();
    if missing.is_empty() {
        return Ok(());
    }
    if missing.len() > parity_count {
        return Err(CodecError::TooManyLost {
            level,
            missing: missing.len(),
            tolerated: parity_count,
        });
    }
    let lost_data = missing.iter().any(|&i| i < k);
    if lost_data && level == Level::Raif6 {
        let original = (0..k).filter_map(|i| units[i].as_deref().map(|u| (i, u)));
        let recovery = (0..2).filter_map(|i| units[k + i].as_deref().map(|u| (i, u)));
        let restored = reed_solomon_simd::decode(k, 2, original, recovery)
            .map_err(|e| CodecError::ReedSolomon(e.to_string()))?;
        for (index, unit) in restored {
            units[index] = Some(unit);
        }
    } else if lost_data {
        // XOR: the one lost data unit is the XOR of all the others.
        let len = units.iter().flatten().next().map_or(0, |u| u.len());
        let mut acc = vec![0u8; len];
        for unit in units.iter().flatten() {
            xor_into(&mut acc, unit);
        }
        units[missing[0]] = Some(acc);
    }
    // Every data unit is known now; lost parity is computed again.
    if units[k..].iter().any(|u| u.is_none()) {
        let data: Vec<&[u8]> = units[..k]
            .iter()
            .map(|u| u.as_deref().unwrap_or(&[]))
            .collect();
        let fresh = parity(level, &data)?;
        for (slot, unit) in units[k..].iter_mut().zip(fresh) {
            if slot.is_none() {
                *slot = Some(unit);
            }
        }
    }
    Ok(())
}
