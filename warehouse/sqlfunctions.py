"""The functions people's SQL may call (:mod:`warehouse.usersql`): a vetted allow-list.

A function is allowed when DuckDB files it under one of :data:`VETTED_CATEGORIES` (pure
functions of their arguments: strings, numbers, dates, lists, structs…), or when it is named in
:data:`VETTED_UNCATEGORIZED`: DuckDB 1.4's uncategorised scalar, aggregate and macro functions,
each read and kept only when it computes from its arguments alone. Left out on purpose: what
reads settings, variables, the query text, sessions or the catalog (``current_setting``,
``getvariable``, ``current_query``, ``pg_get_viewdef``, ``duckdb_*``…), what binds SQL given as
text (``json_serialize_sql``, ``json_serialize_plan``, ``json_deserialize_sql``), what writes
logs or advances sequences (``write_log``, ``nextval``, ``setseed``), and internal helpers.
A function a newer DuckDB adds is refused until it is vetted here.
"""

from __future__ import annotations

#: DuckDB's function categories whose members compute from their arguments alone.
VETTED_CATEGORIES = frozenset(
    {
        "aggregate",
        "array",
        "bitstring",
        "blob",
        "date",
        "lambda",
        "list",
        "numeric",
        "regex",
        "string",
        "struct",
        "text_similarity",
        "timestamp",
        "variant",
    }
)

#: Uncategorised functions read one by one and kept (operators, aggregates, JSON, dates…).
VETTED_UNCATEGORIZED = frozenset(
    """
    !__postfix !~~ !~~* % & * ** + - ->> / // << >> @ ^ abs acos acosh add age any_value
    approx_count_distinct approx_quantile approx_top_k arbitrary arg_max arg_max_null
    arg_min arg_min_null argmax argmin array_agg array_append array_extract array_intersect
    array_pop_back array_pop_front array_prepend array_push_back array_push_front
    array_reverse array_to_json array_to_string array_to_string_comma_default asin asinh
    atan atan2 atanh avg bit_and bit_count bit_or bit_position bit_xor bitstring
    bitstring_agg bool_and bool_or cardinality cbrt ceil ceiling century contains corr cos
    cosh cot count count_if count_star countif covar_pop covar_samp current_date
    current_localtime current_localtimestamp date_add date_diff date_part date_sub
    date_trunc datediff datepart datesub datetrunc day dayname dayofmonth dayofweek
    dayofyear decade degrees divide element_at entropy enum_code enum_first enum_last
    enum_range enum_range_boundary epoch epoch_ms epoch_ns epoch_us era even exp factorial
    favg fdiv first floor fmod from_json from_json_strict fsum gamma gcd gen_random_uuid
    generate_subscripts geomean geometric_mean get_bit get_current_time
    get_current_timestamp greatest_common_divisor group_concat histogram histogram_exact
    hour icu_sort_key isfinite isinf isnan isodow isoyear json json_array json_array_length
    json_contains json_exists json_extract json_extract_path json_extract_path_text
    json_extract_string json_group_array json_group_object json_group_structure json_keys
    json_merge_patch json_object json_pretty json_quote json_structure json_transform
    json_transform_strict json_type json_valid json_value julian kahan_sum kurtosis
    kurtosis_pop last last_day lcm least_common_multiple lgamma list list_any_value
    list_append list_approx_count_distinct list_avg list_bit_and list_bit_or list_bit_xor
    list_bool_and list_bool_or list_count list_entropy list_first list_histogram
    list_intersect list_kurtosis list_kurtosis_pop list_last list_mad list_max list_median
    list_min list_mode list_prepend list_product list_reverse list_sem list_skewness
    list_stddev_pop list_stddev_samp list_string_agg list_sum list_var_pop list_var_samp
    listagg ln log log10 log2 mad make_date make_time make_timestamp make_timestamp_ms
    make_timestamp_ns make_timestamptz map map_concat map_contains map_contains_entry
    map_contains_value map_entries map_extract map_extract_value map_from_entries map_keys
    map_values max max_by mean median microsecond millennium millisecond min min_by minute
    mod mode month monthname multiply nanosecond nextafter normalized_interval now nullif pi
    pow power product quantile quantile_cont quantile_disc quarter radians random
    regexp_split_to_table regr_avgx regr_avgy regr_count regr_intercept regr_r2 regr_slope
    regr_sxx regr_sxy regr_syy repeat reservoir_quantile round round_even roundbankers row
    row_to_json second sem set_bit sign signbit sin sinh skewness split_part sqrt stddev
    stddev_pop stddev_samp strftime string_agg strptime struct_concat struct_contains
    struct_extract struct_extract_at struct_has struct_indexof struct_insert struct_pack
    struct_position struct_update subtract sum sum_no_overflow sumkahan tan tanh time_bucket
    timezone timezone_hour timezone_minute to_centuries to_days to_decades to_hours to_json
    to_microseconds to_millennia to_milliseconds to_minutes to_months to_quarters to_seconds
    to_timestamp to_weeks to_years today transaction_timestamp trunc try_strptime typeof
    union_extract union_tag union_value uuid uuid_extract_timestamp uuid_extract_version
    uuidv4 uuidv7 var_pop var_samp variance variant_extract wavg week weekday weekofyear
    weighted_avg xor year yearweek | ~ ~~ ~~* ~~~
    """.split()  # noqa: SIM905 (a name a word: easier to read and to diff)
)

#: Window functions (not listed by ``duckdb_functions()``) and ``unnest`` in a select list.
WINDOW_FUNCTIONS = frozenset(
    {
        "unnest",
        "row_number",
        "rank",
        "dense_rank",
        "percent_rank",
        "cume_dist",
        "ntile",
        "lag",
        "lead",
        "first_value",
        "last_value",
        "nth_value",
        "fill",
    }
)
