//! Layouts of Node 18 to 24 from their constants, against values read off
//! V8's sources for those releases.

use agent_fixtures::v8::{NODE_CONSTANTS, NODE20_CONSTANTS, NODE24_CONSTANTS};

use crate::v8::{Constants, Layout};

fn layout(text: &str) -> Layout {
    Layout::new(&Constants::parse(text).expect("the constants parse")).expect("every constant")
}

#[test]
fn every_release_has_what_firn_needs() {
    for (major, text) in NODE_CONSTANTS {
        let constants = Constants::parse(text).expect("the constants parse");
        assert!(constants.len() > 400, "node {major}: {}", constants.len());
        let layout =
            Layout::new(&constants).unwrap_or_else(|error| panic!("node {major}: {error}"));
        // No official Node build compresses pointers; all keep a 64-bit
        // heap with 32-bit Smis in the upper half.
        assert_eq!(layout.tagging.tagged_size, 8, "node {major}");
        assert_eq!(layout.tagging.smi_shift, 32, "node {major}");
        assert_eq!(layout.tagging.heap_object_tag, 1, "node {major}");
        assert_eq!(layout.tagging.heap_object_tag_mask, 3, "node {major}");
        // The standard frame: function below the context below the frame
        // pointer; interpreted frames add the bytecode array and offset.
        assert_eq!(layout.frame.function, -16, "node {major}");
        assert_eq!(layout.frame.context, -8, "node {major}");
        assert_eq!(layout.frame.bytecode_array, -32, "node {major}");
        assert_eq!(layout.frame.bytecode_offset, -40, "node {major}");
        assert_eq!(layout.fields.heap_object_map, 0, "node {major}");
        assert_eq!(layout.fields.map_instance_type, 12, "node {major}");
        assert!(layout.types.first_nonstring == 128, "node {major}");
        // The receiver right above the return address (arguments pushed
        // last to first), and a map's constructor where V8 has kept it.
        // Class constructors are JSFunctions: the range exported from V8
        // 12, derived before.
        let (first, last) = layout.types.js_function;
        let expected = match major {
            18 => (2065, 2096),
            20 => (2066, 2096),
            22 => (2066, 2082),
            _ => (2065, 2081),
        };
        assert_eq!((first, last), expected, "node {major}");
        let receivers = layout.receivers.expect("methods named by class");
        assert_eq!(receivers.slot, 16, "node {major}");
        assert_eq!(receivers.map_constructor, 32, "node {major}");
    }
}

#[test]
fn fields_whose_names_changed_are_found() {
    // Node 20 (V8 11.3): `script_or_debug_info__HeapObject`, the name
    // field typed `Object`; Node 24 (V8 13.6): `script__Tagged_HeapObject_`
    // and `name_or_scope_info__Tagged_NameOrScopeInfoT_`.
    let node20 = layout(NODE20_CONSTANTS);
    assert_eq!(node20.fields.sfi_script, 32);
    assert_eq!(node20.fields.sfi_name_or_scope_info, 16);
    assert_eq!(node20.fields.js_function_shared, 24);
    // Not exported before V8 12: up to the next type that is.
    assert_eq!(node20.types.js_function, (2066, 2096));
    let node24 = layout(NODE24_CONSTANTS);
    assert_eq!(node24.fields.sfi_script, 40);
    assert_eq!(node24.fields.sfi_name_or_scope_info, 24);
    assert_eq!(node24.fields.js_function_shared, 32);
    // V8 12 and later export the range of JSFunction's subtypes (class
    // constructors and the like are JSFunctions too).
    assert_eq!(node24.types.js_function, (2065, 2081));
}

#[test]
fn smis_and_pointers_decode() {
    let tagging = layout(NODE20_CONSTANTS).tagging;
    assert_eq!(tagging.smi(42 << 32), Some(42));
    assert_eq!(tagging.smi((-3i64 << 32) as u64), Some(-3));
    assert_eq!(tagging.smi(0x1000_0001), None);
    assert!(tagging.is_heap_object(0x3a4f_0000_1231));
    assert!(!tagging.is_heap_object(0x3a4f_0000_1230));
    assert_eq!(tagging.untag(0x3a4f_0000_1231), 0x3a4f_0000_1230);
}

#[test]
fn missing_constants_are_all_named() {
    let mut text = String::new();
    for line in NODE20_CONSTANTS.lines() {
        if line.starts_with("v8dbg_off_fp_function ")
            || line.starts_with("v8dbg_class_JSFunction__shared__")
            || line.starts_with("v8dbg_type_Script__")
        {
            continue;
        }
        text.push_str(line);
        text.push('\n');
    }
    let error = Layout::new(&Constants::parse(&text).expect("parses")).expect_err("incomplete");
    assert_eq!(
        error.missing,
        [
            "off_fp_function",
            "type_Script__SCRIPT_TYPE",
            "class_JSFunction__shared",
        ]
    );
}

#[test]
fn bad_constant_lines_are_errors() {
    assert!(Constants::parse("v8dbg_a 1 2\n").is_err());
    assert!(Constants::parse("v8dbg_a x\n").is_err());
    let constants = Constants::parse("# comment\n\nv8dbg_a -8\nb 3\n").expect("parses");
    assert_eq!(constants.get("a"), Some(-8));
    assert_eq!(constants.get("b"), Some(3));
}

#[test]
fn each_release_says_enough_to_find_the_code_a_frame_runs() {
    for (major, text) in NODE_CONSTANTS {
        let code = layout(text)
            .code
            .unwrap_or_else(|| panic!("node {major}: no code layout"));
        // V8 10 keeps instructions in the Code object after a 128-byte
        // header; from V8 11 in an InstructionStream of their own.
        let expected = match major {
            18 => (false, 128, Some(40)),
            20 => (true, 16, None),
            22 => (true, 32, Some(52)),
            _ => (true, 32, Some(56)),
        };
        assert_eq!(
            (
                code.stream_type.is_some(),
                code.header,
                code.instruction_size
            ),
            expected,
            "node {major}"
        );
        // Only V8 11 exports where a Code keeps its tables; the others are
        // learned from the process.
        let exported = (code.deoptimization_data, code.source_positions);
        match major {
            20 => assert_eq!(exported, (Some(16), Some(24)), "node {major}"),
            _ => assert_eq!(exported, (None, None), "node {major}"),
        }
        // V8 11 does not export Code's flags: baseline code is told from
        // the frame alone there.
        let kind = code.kind.map(|kind| (kind.mask, kind.shift));
        let expected = (major != 20).then_some((15, 0));
        assert_eq!(kind, expected, "node {major}");
        let deopt = code.deopt;
        match major {
            18 => assert_eq!((deopt.shared, deopt.inlining_positions), (None, None)),
            24 => {
                assert_eq!((deopt.shared, deopt.inlining_positions), (Some(7), Some(8)));
                assert_eq!(deopt.literal_array, 3);
                assert!(deopt.shared_wrapper.is_some());
            }
            _ => assert_eq!(
                (deopt.shared, deopt.inlining_positions),
                (Some(6), Some(7)),
                "node {major}"
            ),
        }
    }
}
